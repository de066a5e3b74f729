package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/pagewarden/pagewarden/internal/kvcache"
)

// The Kubernetes manifests under deploy/kubernetes are checked here rather
// than with a cluster: decoded (the fields these checks read) and
// cross-checked, with every container's arguments and PAGEWARDEN_*
// variables parsed by the real commands. k8s.io/api is not a dependency
// of this module (and cannot be fetched where CI runs), so fields the
// checks do not read are not type-checked; kubectl's dry run does that.

const manifestDir = "../../deploy/kubernetes"

// external are the objects the manifests use and the operator creates
// (README, "Deploying on several hosts").
var external = map[string][]string{
	"Secret":                {"pagewarden-tls", "pagewarden-api-key"},
	"PersistentVolumeClaim": {"pagewarden-models"},
}

type k8sPort struct {
	Name          string    `yaml:"name"`
	ContainerPort int       `yaml:"containerPort"`
	Port          int       `yaml:"port"`
	TargetPort    yaml.Node `yaml:"targetPort"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string    `yaml:"path"`
		Port yaml.Node `yaml:"port"`
	} `yaml:"httpGet"`
	TCPSocket *struct {
		Port yaml.Node `yaml:"port"`
	} `yaml:"tcpSocket"`
}

type k8sContainer struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
			ConfigMapKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"configMapKeyRef"`
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	EnvFrom []struct {
		ConfigMapRef *struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
		SecretRef *struct {
			Name string `yaml:"name"`
		} `yaml:"secretRef"`
	} `yaml:"envFrom"`
	Ports          []k8sPort `yaml:"ports"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type k8sObject struct {
	file       string
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data      map[string]string `yaml:"data"`
	Resources []string          `yaml:"resources"` // a Kustomization's
	Spec      struct {
		Selector             yaml.Node `yaml:"selector"` // a Service's labels, or {matchLabels}
		ServiceName          string    `yaml:"serviceName"`
		Replicas             int       `yaml:"replicas"`
		Ports                []k8sPort `yaml:"ports"`
		VolumeClaimTemplates []struct {
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
		} `yaml:"volumeClaimTemplates"`
		Template struct {
			Metadata struct {
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"metadata"`
			Spec struct {
				Containers []k8sContainer `yaml:"containers"`
				Volumes    []struct {
					Name   string `yaml:"name"`
					Secret *struct {
						SecretName string `yaml:"secretName"`
					} `yaml:"secret"`
					ConfigMap *struct {
						Name string `yaml:"name"`
					} `yaml:"configMap"`
					PersistentVolumeClaim *struct {
						ClaimName string `yaml:"claimName"`
					} `yaml:"persistentVolumeClaim"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

func (o *k8sObject) String() string { return o.file + ": " + o.Kind + "/" + o.Metadata.Name }

// selector returns a Service's selector, or a workload's or budget's
// matchLabels.
func (o *k8sObject) selector() (map[string]string, error) {
	var raw map[string]any
	if err := o.Spec.Selector.Decode(&raw); err != nil {
		return nil, err
	}
	if o.Kind != "Service" {
		var s struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		}
		if err := o.Spec.Selector.Decode(&s); err != nil {
			return nil, err
		}
		return s.MatchLabels, nil
	}
	var s map[string]string
	err := o.Spec.Selector.Decode(&s)
	return s, err
}

func readManifests(t *testing.T) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	paths, err := filepath.Glob(filepath.Join(manifestDir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests in %s: %v", manifestDir, err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(p)] = b
	}
	return files
}

// roleCommands are the commands a manifest may run, built afresh for
// each container (flags keep what was parsed).
var roleCommands = map[string]func() *cobra.Command{"gateway": gatewayCmd, "prefill": prefillCmd, "decode": decodeCmd}

// envFlag is the flag a PAGEWARDEN_* variable sets (cli.go's envName,
// inverted).
func envFlag(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, "PAGEWARDEN_")
	return strings.ToLower(strings.ReplaceAll(rest, "_", "-")), ok
}

// portOf resolves a probe's or Service's port (a name or a number) to a
// container port, or 0.
func portOf(n yaml.Node, ports []k8sPort) int {
	for _, p := range ports {
		if n.Value == p.Name || n.Value == strconv.Itoa(p.ContainerPort) {
			return p.ContainerPort
		}
	}
	return 0
}

// quantity parses the Kubernetes memory quantities the manifests use.
func quantity(s string) (int64, error) {
	for _, u := range []struct {
		suffix string
		mul    int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			return v * u.mul, err
		}
	}
	return strconv.ParseInt(s, 10, 64)
}

// checkManifests returns every problem it finds in files (name → YAML).
func checkManifests(files map[string][]byte) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	var objs []*k8sObject
	for _, name := range slices.Sorted(maps.Keys(files)) {
		dec := yaml.NewDecoder(bytes.NewReader(files[name]))
		for {
			o := &k8sObject{file: name}
			err := dec.Decode(o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				bad("%s: %v", name, err)
				break
			}
			if o.Kind == "" || o.APIVersion == "" {
				bad("%s: an object without kind or apiVersion", name)
				continue
			}
			objs = append(objs, o)
		}
	}
	exists := map[string]map[string]bool{}
	for kind, names := range external {
		exists[kind] = map[string]bool{}
		for _, n := range names {
			exists[kind][n] = true
		}
	}
	for _, o := range objs {
		if exists[o.Kind] == nil {
			exists[o.Kind] = map[string]bool{}
		}
		if exists[o.Kind][o.Metadata.Name] && o.Kind != "Kustomization" {
			bad("%v: defined twice", o)
		}
		exists[o.Kind][o.Metadata.Name] = true
	}
	refer := func(o *k8sObject, kind, name string) {
		if !exists[kind][name] {
			bad("%v: %s %q is neither in the manifests nor one the README has the operator create", o, kind, name)
		}
	}
	configMaps := map[string]map[string]string{}
	for _, o := range objs {
		if o.Kind == "ConfigMap" {
			configMaps[o.Metadata.Name] = o.Data
		}
	}
	checkEtcdEndpoints(objs, bad)
	var workloads []*k8sObject
	for _, o := range objs {
		switch o.Kind {
		case "Kustomization":
			want := slices.DeleteFunc(slices.Sorted(maps.Keys(files)), func(f string) bool { return f == o.file })
			if got := slices.Sorted(slices.Values(o.Resources)); !slices.Equal(got, want) {
				bad("%v: resources %v, want every manifest: %v", o, got, want)
			}
		case "Deployment", "StatefulSet":
			workloads = append(workloads, o)
			checkWorkload(o, configMaps, refer, bad)
		}
	}
	// Services and budgets select the pods of a workload; a Service's
	// target ports are ports of those pods; a StatefulSet's service exists.
	for _, o := range objs {
		switch o.Kind {
		case "Service", "PodDisruptionBudget":
			sel, err := o.selector()
			if err != nil || len(sel) == 0 {
				bad("%v: no selector (%v)", o, err)
				continue
			}
			var hit *k8sObject
			for _, w := range workloads {
				if matches(sel, w.Spec.Template.Metadata.Labels) {
					hit = w
				}
			}
			if hit == nil {
				bad("%v: selector %v matches no workload's pods", o, sel)
				continue
			}
			for _, p := range o.Spec.Ports {
				if p.TargetPort.Value != "" && portOf(p.TargetPort, hit.Spec.Template.Spec.Containers[0].Ports) == 0 {
					bad("%v: port %s targets %q, not a port of %v", o, p.Name, p.TargetPort.Value, hit)
				}
			}
		case "StatefulSet":
			refer(o, "Service", o.Spec.ServiceName)
		}
	}
	return problems
}

func matches(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// checkWorkload checks a Deployment's or StatefulSet's pods.
func checkWorkload(o *k8sObject, configMaps map[string]map[string]string, refer func(o *k8sObject, kind, name string), bad func(string, ...any)) {
	tpl := o.Spec.Template
	sel, err := o.selector()
	if err != nil || len(sel) == 0 || !matches(sel, tpl.Metadata.Labels) {
		bad("%v: selector %v does not match its pod labels %v (%v)", o, sel, tpl.Metadata.Labels, err)
	}
	volumes := map[string]bool{}
	for _, v := range o.Spec.VolumeClaimTemplates {
		volumes[v.Metadata.Name] = true
	}
	for _, v := range tpl.Spec.Volumes {
		volumes[v.Name] = true
		switch {
		case v.Secret != nil:
			refer(o, "Secret", v.Secret.SecretName)
		case v.ConfigMap != nil:
			refer(o, "ConfigMap", v.ConfigMap.Name)
		case v.PersistentVolumeClaim != nil:
			refer(o, "PersistentVolumeClaim", v.PersistentVolumeClaim.ClaimName)
		}
	}
	if len(tpl.Spec.Containers) == 0 {
		bad("%v: no containers", o)
	}
	for _, c := range tpl.Spec.Containers {
		where := fmt.Sprintf("%v container %s", o, c.Name)
		if !strings.Contains(c.Image, "pagewarden/pagewarden") {
			checkOtherContainer(where, c, volumes, bad)
			continue
		}
		if len(c.Command) > 0 || len(c.Args) == 0 {
			bad("%s: want the image's entrypoint with args ROLE --flag=value...", where)
			continue
		}
		mk, ok := roleCommands[c.Args[0]]
		if !ok {
			bad("%s: runs %q, not a node role", where, c.Args[0])
			continue
		}
		cmd := mk()
		// Variables: $(VAR) in args must be defined; PAGEWARDEN_* must
		// name a flag of the command and hold a value it accepts.
		defined := map[string]bool{}
		fromEnv := map[string]string{} // flag → value, set unless args set it
		for _, e := range c.Env {
			defined[e.Name] = true
			if vf := e.ValueFrom; vf != nil {
				switch {
				case vf.SecretKeyRef != nil:
					refer(o, "Secret", vf.SecretKeyRef.Name)
				case vf.ConfigMapKeyRef != nil:
					refer(o, "ConfigMap", vf.ConfigMapKeyRef.Name)
				}
			}
			if f, ok := envFlag(e.Name); ok {
				if cmd.Flags().Lookup(f) == nil {
					bad("%s: %s sets no flag of %s (--%s)", where, e.Name, c.Args[0], f)
				} else if e.ValueFrom == nil {
					fromEnv[f] = e.Value
				}
			}
		}
		for _, ef := range c.EnvFrom {
			switch {
			case ef.ConfigMapRef != nil:
				refer(o, "ConfigMap", ef.ConfigMapRef.Name)
				for k, v := range configMaps[ef.ConfigMapRef.Name] {
					defined[k] = true
					f, ok := envFlag(k)
					if !ok {
						continue
					}
					if cmd.Flags().Lookup(f) == nil {
						bad("%s: %s (ConfigMap %s) sets no flag of %s (--%s)", where, k, ef.ConfigMapRef.Name, c.Args[0], f)
						continue
					}
					fromEnv[f] = v
				}
			case ef.SecretRef != nil:
				refer(o, "Secret", ef.SecretRef.Name)
			}
		}
		args := slices.Clone(c.Args[1:])
		for i, a := range args {
			for _, m := range varRef.FindAllStringSubmatch(a, -1) {
				if !defined[m[1]] {
					bad("%s: %s uses $(%s), which the container does not define", where, a, m[1])
				}
			}
			// A value that parses where the real one will: a name, an IP.
			args[i] = strings.ReplaceAll(varRef.ReplaceAllString(a, "x"), "--advertise-addr=x:", "--advertise-addr=10.0.0.1:")
		}
		if err := cmd.ParseFlags(args); err != nil {
			bad("%s: %s does not accept %q: %v", where, c.Args[0], c.Args[1:], err)
			continue
		}
		if rest := cmd.Flags().Args(); len(rest) > 0 {
			bad("%s: stray arguments %q", where, rest)
		}
		for f, v := range fromEnv {
			if cmd.Flags().Changed(f) {
				continue
			}
			if err := cmd.Flags().Set(f, v); err != nil {
				bad("%s: --%s %q (from the environment): %v", where, f, v, err)
			}
		}
		flag := func(name string) string {
			if f := cmd.Flags().Lookup(name); f != nil {
				return f.Value.String()
			}
			return ""
		}
		// The flags' ports are the container's named ports.
		for port, fl := range map[string]string{"http": "listen", "metrics": "metrics-listen", "link": "link-listen"} {
			addr := flag(fl)
			if addr == "" {
				continue
			}
			_, p, err := net.SplitHostPort(addr)
			if err != nil {
				bad("%s: --%s %q: %v", where, fl, addr, err)
				continue
			}
			if host, _, _ := net.SplitHostPort(addr); fl != "metrics-listen" && (host == "127.0.0.1" || host == "localhost") {
				bad("%s: --%s %s listens on loopback only", where, fl, addr)
			}
			if got := portOf(yaml.Node{Value: port}, c.Ports); strconv.Itoa(got) != p {
				bad("%s: --%s listens on port %s, but the container's %q port is %d", where, fl, p, port, got)
			}
		}
		if adv := flag("advertise-addr"); adv != "" {
			if _, p, _ := net.SplitHostPort(adv); p != strconv.Itoa(portOf(yaml.Node{Value: "link"}, c.Ports)) {
				bad("%s: --advertise-addr %s is not the link port", where, adv)
			}
		}
		// Probes reach a port the container has, on a path it serves.
		paths := map[string][]string{"http": {"/healthz", "/readyz"}, "metrics": {"/metrics"}}
		for kind, p := range map[string]*k8sProbe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
			switch {
			case p == nil:
				bad("%s: no %s probe", where, kind)
			case p.HTTPGet != nil:
				port := portOf(p.HTTPGet.Port, c.Ports)
				served := false
				for _, cp := range c.Ports {
					if cp.ContainerPort == port && slices.Contains(paths[cp.Name], p.HTTPGet.Path) {
						served = true
					}
				}
				if port == 0 || !served {
					bad("%s: %s probe GET %s on port %s, which the container does not serve", where, kind, p.HTTPGet.Path, p.HTTPGet.Port.Value)
				}
			case p.TCPSocket != nil:
				if portOf(p.TCPSocket.Port, c.Ports) == 0 {
					bad("%s: %s probe on port %s, not a port of the container", where, kind, p.TCPSocket.Port.Value)
				}
			default:
				bad("%s: %s probe neither httpGet nor tcpSocket", where, kind)
			}
		}
		// Prometheus scrapes the metrics port.
		if a := tpl.Metadata.Annotations; a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != strconv.Itoa(portOf(yaml.Node{Value: "metrics"}, c.Ports)) {
			bad("%s: prometheus.io annotations %v do not name the metrics port", where, a)
		}
		// Files the flags name are on a mounted volume.
		mounts := map[string]bool{}
		for _, m := range c.VolumeMounts {
			if !volumes[m.Name] {
				bad("%s: mounts volume %q, which the pod does not have", where, m.Name)
			}
			mounts[m.MountPath] = true
		}
		for _, fl := range []string{"tls-ca", "tls-cert", "tls-key", "model"} {
			if v := flag(fl); strings.HasPrefix(v, "/") && !mounts[filepath.Dir(v)] {
				bad("%s: --%s %s is on no mounted volume", where, fl, v)
			}
		}
		// Memory: a node's request covers the KV cache it is given (the
		// gateway only plans with --kv-memory; it allocates none).
		if kv := flag("kv-memory"); kv != "" && c.Args[0] != "gateway" {
			b, err := kvcache.ParseBytes(kv)
			req, rerr := quantity(c.Resources.Requests["memory"])
			lim, lerr := quantity(c.Resources.Limits["memory"])
			switch {
			case err != nil || rerr != nil || lerr != nil:
				bad("%s: --kv-memory %q, memory request %q, limit %q: %v", where, kv, c.Resources.Requests["memory"], c.Resources.Limits["memory"], errors.Join(err, rerr, lerr))
			case req < b+b/4 || lim < req:
				bad("%s: memory request %s (limit %s) does not cover --kv-memory %s with a quarter to spare for the model and working memory",
					where, c.Resources.Requests["memory"], c.Resources.Limits["memory"], kv)
			}
		}
	}
}

// TestKubernetesManifests: deploy/kubernetes passes every check, and each
// check fails on a manifest broken the way a typo would break it (a
// positive control for each).
func TestKubernetesManifests(t *testing.T) {
	files := readManifests(t)
	for _, p := range checkManifests(files) {
		t.Error(p)
	}
	for _, tc := range []struct {
		file, old, new, says string
	}{
		{"decode.yaml", "--metrics-listen=", "--metric-listen=", "does not accept"},
		{"prefill.yaml", "--kv-memory=2GiB", "--kv-memory=2GB!", "invalid memory size"},
		{"gateway.yaml", "- --drain-timeout=30s", "- --drain-timeout=30s\n            - extra", "stray arguments"},
		{"gateway.yaml", "--kv-memory=8GiB", "--kv-memory 8GiB", "does not accept"},
		{"config.yaml", "PAGEWARDEN_ETCD_PREFIX", "PAGEWARDEN_ETCD_PREFX", "sets no flag"},
		{"config.yaml", `PAGEWARDEN_MAX_CONTEXT: "8192"`, `PAGEWARDEN_MAX_CONTEXT: "8k"`, "from the environment"},
		{"gateway.yaml", "name: pagewarden-cluster", "name: pagewarden-clustr", `ConfigMap "pagewarden-clustr"`},
		{"decode.yaml", "secretName: pagewarden-tls", "secretName: pagewarden-tsl", `Secret "pagewarden-tsl"`},
		{"decode.yaml", "$(POD_NAME).pem", "$(POD_NAM).pem", "$(POD_NAM)"},
		{"gateway.yaml", "    app.kubernetes.io/component: gateway\n  ports:", "    app.kubernetes.io/component: gatewy\n  ports:", "matches no workload"},
		{"prefill.yaml", "path: /metrics\n              port: metrics", "path: /healthz\n              port: metrics", "does not serve"},
		{"gateway.yaml", "--listen=0.0.0.0:8080", "--listen=0.0.0.0:8000", `"http" port is 8080`},
		{"decode.yaml", "memory: 12Gi\n            limits", "memory: 8Gi\n            limits", "does not cover --kv-memory"},
		{"decode.yaml", "mountPath: /etc/pagewarden/tls", "mountPath: /etc/pagewarden/certs", "on no mounted volume"},
		{"kustomization.yaml", "  - decode.yaml\n", "", "want every manifest"},
		{"decode.yaml", "prometheus.io/port: \"9464\"", "prometheus.io/port: \"9465\"", "metrics port"},
		{"config.yaml", "etcd-2.etcd:2379", "etcd-3.etcd:2379", "names no pod"},
		{"config.yaml", "etcd-0.etcd:2379", "etcd-0.etcd:2380x", "not a port of Service"},
		{"etcd.yaml", "--name=$(POD_NAME)", "--name=$(POD)", "$(POD)"},
		{"etcd.yaml", "- name: data\n              mountPath", "- name: date\n              mountPath", `volume "date"`},
	} {
		t.Run(tc.file+" "+strings.Fields(tc.new + " (deleted)")[0], func(t *testing.T) {
			broken := maps.Clone(files)
			if !bytes.Contains(broken[tc.file], []byte(tc.old)) {
				t.Fatalf("%s does not contain %q", tc.file, tc.old)
			}
			broken[tc.file] = bytes.Replace(broken[tc.file], []byte(tc.old), []byte(tc.new), 1)
			problems := checkManifests(broken)
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.says) }) {
				t.Errorf("no problem saying %q; got %q", tc.says, problems)
			}
		})
	}
}

// checkOtherContainer checks what can be checked of a container that is
// not pagewarden's (etcd): its variables, probe ports and mounts.
func checkOtherContainer(where string, c k8sContainer, volumes map[string]bool, bad func(string, ...any)) {
	defined := map[string]bool{}
	for _, e := range c.Env {
		defined[e.Name] = true
	}
	for _, a := range slices.Concat(c.Command, c.Args) {
		for _, m := range varRef.FindAllStringSubmatch(a, -1) {
			if !defined[m[1]] {
				bad("%s: %s uses $(%s), which the container does not define", where, a, m[1])
			}
		}
	}
	for kind, p := range map[string]*k8sProbe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		switch {
		case p == nil:
			bad("%s: no %s probe", where, kind)
		case p.HTTPGet != nil && portOf(p.HTTPGet.Port, c.Ports) == 0, p.TCPSocket != nil && portOf(p.TCPSocket.Port, c.Ports) == 0:
			bad("%s: %s probe on a port the container does not have", where, kind)
		}
	}
	for _, m := range c.VolumeMounts {
		if !volumes[m.Name] {
			bad("%s: mounts volume %q, which the pod does not have", where, m.Name)
		}
	}
}

// checkEtcdEndpoints checks the PAGEWARDEN_ETCD endpoints of the
// ConfigMaps that name a Service of the manifests (POD.SERVICE:PORT): the
// Service is a StatefulSet's, POD is one of its pods and PORT a port of
// the Service. Endpoints outside the manifests (an existing etcd) are the
// operator's.
func checkEtcdEndpoints(objs []*k8sObject, bad func(string, ...any)) {
	services := map[string]*k8sObject{}
	sets := map[string]*k8sObject{} // by serviceName
	for _, o := range objs {
		switch o.Kind {
		case "Service":
			services[o.Metadata.Name] = o
		case "StatefulSet":
			sets[o.Spec.ServiceName] = o
		}
	}
	for _, o := range objs {
		v, ok := o.Data["PAGEWARDEN_ETCD"]
		if o.Kind != "ConfigMap" || !ok {
			continue
		}
		for _, ep := range strings.Split(v, ",") {
			host, port, err := net.SplitHostPort(strings.TrimSpace(ep))
			if err != nil {
				bad("%v: PAGEWARDEN_ETCD endpoint %q: %v", o, ep, err)
				continue
			}
			pod, svc, ok := strings.Cut(host, ".")
			if !ok || services[svc] == nil {
				continue
			}
			set := sets[svc]
			if set == nil {
				bad("%v: etcd endpoint %s: Service %s is no StatefulSet's", o, ep, svc)
				continue
			}
			i, err := strconv.Atoi(strings.TrimPrefix(pod, set.Metadata.Name+"-"))
			if err != nil || !strings.HasPrefix(pod, set.Metadata.Name+"-") || i < 0 || i >= set.Spec.Replicas {
				bad("%v: etcd endpoint %s names no pod of %v (%d replicas)", o, ep, set, set.Spec.Replicas)
			}
			if !slices.ContainsFunc(services[svc].Spec.Ports, func(p k8sPort) bool { return strconv.Itoa(p.Port) == port }) {
				bad("%v: etcd endpoint %s: port %s is not a port of Service %s", o, ep, port, svc)
			}
		}
	}
}
