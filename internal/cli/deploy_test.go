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
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	kjson "sigs.k8s.io/json"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/pagewarden/pagewarden/internal/kvcache"
)

// The Kubernetes manifests under deploy/kubernetes are checked here rather
// than with a cluster. Every object is decoded strictly into its k8s.io/api
// type the way the API server's strict field validation does (an unknown,
// misspelt or miscapitalised field, a duplicate key or a value of the
// wrong type is an error naming its path), with the apiVersion its kind
// belongs to; then the cross-references a typo would break are checked,
// with every container's arguments and PAGEWARDEN_* variables parsed by
// the real commands. k8s.io/api is a test-only dependency: the binary does
// not link it.

const manifestDir = "../../deploy/kubernetes"

// external are the objects the manifests use and the operator creates
// (README, "Deploying on several hosts").
var external = map[string][]string{
	"Secret":                {"pagewarden-tls", "pagewarden-api-key", "etcd-tls"},
	"PersistentVolumeClaim": {"pagewarden-models"},
}

// kustomization is the part of kustomize's Kustomization the manifests
// use. kustomize's own types would bring kustomize's module; decoded
// strictly, a field this struct lacks is refused, so using a new one means
// adding it here.
type kustomization struct {
	metav1.TypeMeta `json:",inline"`
	Labels          []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors,omitempty"`
		IncludeTemplates bool              `json:"includeTemplates,omitempty"`
	} `json:"labels,omitempty"`
	Resources []string `json:"resources"`
	Images    []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images,omitempty"`
}

// kinds maps each kind the manifests may hold to its apiVersion and a new
// typed object to decode it into.
var kinds = map[string]struct {
	apiVersion string
	new        func() any
}{
	"ConfigMap":           {"v1", func() any { return &corev1.ConfigMap{} }},
	"Service":             {"v1", func() any { return &corev1.Service{} }},
	"Deployment":          {"apps/v1", func() any { return &appsv1.Deployment{} }},
	"StatefulSet":         {"apps/v1", func() any { return &appsv1.StatefulSet{} }},
	"PodDisruptionBudget": {"policy/v1", func() any { return &policyv1.PodDisruptionBudget{} }},
	"Kustomization":       {"kustomize.config.k8s.io/v1beta1", func() any { return &kustomization{} }},
}

// k8sObject is one decoded object with what the cross-checks read of it
// lifted out of its typed form.
type k8sObject struct {
	file, kind, name string
	typed            any // one of kinds' types
	// selector is a Service's selector or a workload's or budget's
	// matchLabels.
	selector map[string]string
	// pod is a Deployment's or StatefulSet's pod template.
	pod *corev1.PodTemplateSpec
}

func (o *k8sObject) String() string { return o.file + ": " + o.kind + "/" + o.name }

func (o *k8sObject) service() *corev1.Service { s, _ := o.typed.(*corev1.Service); return s }
func (o *k8sObject) statefulSet() *appsv1.StatefulSet {
	s, _ := o.typed.(*appsv1.StatefulSet)
	return s
}
func (o *k8sObject) configMap() *corev1.ConfigMap  { c, _ := o.typed.(*corev1.ConfigMap); return c }
func (o *k8sObject) kustomization() *kustomization { k, _ := o.typed.(*kustomization); return k }

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
func portOf(n intstr.IntOrString, ports []corev1.ContainerPort) int {
	for _, p := range ports {
		if (n.Type == intstr.String && n.StrVal == p.Name) || (n.Type == intstr.Int && n.IntVal == p.ContainerPort) {
			return int(p.ContainerPort)
		}
	}
	return 0
}

// decodeObject decodes one YAML document strictly into the type its kind
// names.
func decodeObject(file string, line int, doc []byte) (*k8sObject, error) {
	var tm metav1.TypeMeta
	if err := sigsyaml.Unmarshal(doc, &tm); err != nil {
		return nil, fmt.Errorf("%s:%d: %v", file, line, err)
	}
	k, ok := kinds[tm.Kind]
	switch {
	case tm.Kind == "" || tm.APIVersion == "":
		return nil, fmt.Errorf("%s:%d: an object without kind or apiVersion", file, line)
	case !ok:
		return nil, fmt.Errorf("%s:%d: kind %s is none the manifests are checked for (%v)", file, line, tm.Kind, slices.Sorted(maps.Keys(kinds)))
	case tm.APIVersion != k.apiVersion:
		return nil, fmt.Errorf("%s:%d: %s in apiVersion %s, want %s", file, line, tm.Kind, tm.APIVersion, k.apiVersion)
	}
	// As the API server's strict field validation does: YAML to JSON
	// refusing duplicate keys, then JSON into the type matching field
	// names case-sensitively (encoding/json would take "Replicas" for
	// "replicas") and refusing unknown ones, each named by its path.
	j, err := sigsyaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, fmt.Errorf("%s:%d: %s: %v", file, line, tm.Kind, err)
	}
	typed := k.new()
	strict, err := kjson.UnmarshalStrict(j, typed)
	if err = errors.Join(append([]error{err}, strict...)...); err != nil {
		return nil, fmt.Errorf("%s:%d: %s: %v", file, line, tm.Kind, err)
	}
	o := &k8sObject{file: file, kind: tm.Kind, typed: typed}
	switch v := typed.(type) {
	case *corev1.ConfigMap:
		o.name = v.Name
	case *corev1.Service:
		o.name, o.selector = v.Name, v.Spec.Selector
	case *appsv1.Deployment:
		o.name, o.pod = v.Name, &v.Spec.Template
		if v.Spec.Selector != nil {
			o.selector = v.Spec.Selector.MatchLabels
		}
	case *appsv1.StatefulSet:
		o.name, o.pod = v.Name, &v.Spec.Template
		if v.Spec.Selector != nil {
			o.selector = v.Spec.Selector.MatchLabels
		}
	case *policyv1.PodDisruptionBudget:
		o.name = v.Name
		if v.Spec.Selector != nil {
			o.selector = v.Spec.Selector.MatchLabels
		}
	case *kustomization:
		o.name = "kustomization"
	}
	return o, nil
}

// decodeObjects decodes every object of files (name → YAML), reporting
// what does not decode to bad.
func decodeObjects(files map[string][]byte, bad func(string, ...any)) []*k8sObject {
	var objs []*k8sObject
	for _, name := range slices.Sorted(maps.Keys(files)) {
		// yaml.v3 splits the documents (and says where each starts);
		// each goes back to YAML for the strict typed decoder.
		dec := yaml.NewDecoder(bytes.NewReader(files[name]))
		for {
			var n yaml.Node
			err := dec.Decode(&n)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				bad("%s: %v", name, err)
				break
			}
			doc, err := yaml.Marshal(&n)
			if err != nil {
				bad("%s:%d: %v", name, n.Line, err)
				continue
			}
			o, err := decodeObject(name, n.Line, doc)
			if err != nil {
				bad("%v", err)
				continue
			}
			objs = append(objs, o)
		}
	}
	return objs
}

// decodeManifests decodes files, failing t on any error.
func decodeManifests(t *testing.T, files map[string][]byte) []*k8sObject {
	t.Helper()
	return decodeObjects(files, func(f string, args ...any) { t.Fatalf(f, args...) })
}

// isPagewarden says whether a container runs the pagewarden image (under
// any registry or tag), whose args are a role and its flags.
func isPagewarden(image string) bool {
	name, _, _ := strings.Cut(image, ":")
	return name == "pagewarden" || strings.HasSuffix(name, "/pagewarden")
}

// checkManifests returns every problem it finds in files (name → YAML).
func checkManifests(files map[string][]byte) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	objs := decodeObjects(files, bad)
	exists := map[string]map[string]bool{}
	for kind, names := range external {
		exists[kind] = map[string]bool{}
		for _, n := range names {
			exists[kind][n] = true
		}
	}
	for _, o := range objs {
		if exists[o.kind] == nil {
			exists[o.kind] = map[string]bool{}
		}
		if exists[o.kind][o.name] && o.kind != "Kustomization" {
			bad("%v: defined twice", o)
		}
		exists[o.kind][o.name] = true
	}
	refer := func(o *k8sObject, kind, name string) {
		if !exists[kind][name] {
			bad("%v: %s %q is neither in the manifests nor one the README has the operator create", o, kind, name)
		}
	}
	configMaps := map[string]map[string]string{}
	for _, o := range objs {
		if cm := o.configMap(); cm != nil {
			configMaps[o.name] = cm.Data
		}
	}
	checkEtcdEndpoints(objs, bad)
	var workloads []*k8sObject
	for _, o := range objs {
		switch o.kind {
		case "Kustomization":
			want := slices.DeleteFunc(slices.Sorted(maps.Keys(files)), func(f string) bool { return f == o.file })
			if got := slices.Sorted(slices.Values(o.kustomization().Resources)); !slices.Equal(got, want) {
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
		switch o.kind {
		case "Service", "PodDisruptionBudget":
			sel := o.selector
			if len(sel) == 0 {
				bad("%v: no selector", o)
				continue
			}
			var hit *k8sObject
			for _, w := range workloads {
				if matches(sel, w.pod.Labels) {
					hit = w
				}
			}
			if hit == nil {
				bad("%v: selector %v matches no workload's pods", o, sel)
				continue
			}
			if svc := o.service(); svc != nil {
				for _, p := range svc.Spec.Ports {
					if p.TargetPort != (intstr.IntOrString{}) && portOf(p.TargetPort, hit.pod.Spec.Containers[0].Ports) == 0 {
						bad("%v: port %s targets %q, not a port of %v", o, p.Name, p.TargetPort.String(), hit)
					}
				}
			}
		case "StatefulSet":
			refer(o, "Service", o.statefulSet().Spec.ServiceName)
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
	tpl := o.pod
	if sel := o.selector; len(sel) == 0 || !matches(sel, tpl.Labels) {
		bad("%v: selector %v does not match its pod labels %v", o, sel, tpl.Labels)
	}
	volumes := map[string]bool{}
	if ss := o.statefulSet(); ss != nil {
		for _, v := range ss.Spec.VolumeClaimTemplates {
			volumes[v.Name] = true
		}
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
		if !isPagewarden(c.Image) {
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
			if got := portOf(intstr.FromString(port), c.Ports); strconv.Itoa(got) != p {
				bad("%s: --%s listens on port %s, but the container's %q port is %d", where, fl, p, port, got)
			}
		}
		if adv := flag("advertise-addr"); adv != "" {
			if _, p, _ := net.SplitHostPort(adv); p != strconv.Itoa(portOf(intstr.FromString("link"), c.Ports)) {
				bad("%s: --advertise-addr %s is not the link port", where, adv)
			}
		}
		// Probes reach a port the container has, on a path it serves.
		paths := map[string][]string{"http": {"/healthz", "/readyz"}, "metrics": {"/metrics"}}
		for kind, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
			switch {
			case p == nil:
				bad("%s: no %s probe", where, kind)
			case p.HTTPGet != nil:
				port := portOf(p.HTTPGet.Port, c.Ports)
				served := false
				for _, cp := range c.Ports {
					if int(cp.ContainerPort) == port && slices.Contains(paths[cp.Name], p.HTTPGet.Path) {
						served = true
					}
				}
				if port == 0 || !served {
					bad("%s: %s probe GET %s on port %s, which the container does not serve", where, kind, p.HTTPGet.Path, p.HTTPGet.Port.String())
				}
			case p.TCPSocket != nil:
				if portOf(p.TCPSocket.Port, c.Ports) == 0 {
					bad("%s: %s probe on port %s, not a port of the container", where, kind, p.TCPSocket.Port.String())
				}
			default:
				bad("%s: %s probe neither httpGet nor tcpSocket", where, kind)
			}
		}
		// Prometheus scrapes the metrics port.
		if a := tpl.Annotations; a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != strconv.Itoa(portOf(intstr.FromString("metrics"), c.Ports)) {
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
		for _, fl := range []string{"tls-ca", "tls-cert", "tls-key", "etcd-ca", "etcd-cert", "etcd-key", "model"} {
			if v := flag(fl); strings.HasPrefix(v, "/") && !mounts[filepath.Dir(v)] {
				bad("%s: --%s %s is on no mounted volume", where, fl, v)
			}
		}
		// etcd over TLS: the manifests' etcd requires client
		// certificates, so a node reaching it by https needs all three.
		if strings.Contains(flag("etcd"), "https://") {
			for _, fl := range []string{"etcd-ca", "etcd-cert", "etcd-key"} {
				if flag(fl) == "" {
					bad("%s: --etcd over https without --%s (etcd requires a client certificate from its CA)", where, fl)
				}
			}
		}
		// Memory: a node's request covers the KV cache it is given (the
		// gateway only plans with --kv-memory; it allocates none).
		if kv := flag("kv-memory"); kv != "" && c.Args[0] != "gateway" {
			b, err := kvcache.ParseBytes(kv)
			req, lim := c.Resources.Requests.Memory(), c.Resources.Limits.Memory()
			switch {
			case err != nil:
				bad("%s: --kv-memory %q: %v", where, kv, err)
			case req.Value() < b+b/4 || lim.Cmp(*req) < 0:
				bad("%s: memory request %v (limit %v) does not cover --kv-memory %s with a quarter to spare for the model and working memory",
					where, req, lim, kv)
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
		// Strict typed decoding: misspelt fields, wrong types, duplicate
		// keys, kinds in the wrong apiVersion, unknown kinds.
		{"decode.yaml", "readinessProbe:", "readinesProbe:", `unknown field "spec.template.spec.containers[0].readinesProbe"`},
		{"etcd.yaml", "podManagementPolicy: Parallel", "podManagmentPolicy: Parallel", "unknown field"},
		{"kustomization.yaml", "newTag: dev", "newtag: dev", `unknown field "images[0].newtag"`},
		{"gateway.yaml", "  replicas: 1", "  Replicas: 1", `unknown field "spec.Replicas"`},
		{"gateway.yaml", "replicas: 1", "replicas: one", "cannot unmarshal string"},
		{"decode.yaml", "memory: 12Gi\n            limits", "memory: 12GB!\n            limits", "quantities must match"},
		{"config.yaml", `PAGEWARDEN_MAX_CONTEXT: "8192"`, `PAGEWARDEN_MAX_CONTEXT: "8192"` + "\n  PAGEWARDEN_MAX_CONTEXT: \"4096\"", "already set"},
		{"prefill.yaml", "apiVersion: apps/v1", "apiVersion: app/v1", "want apps/v1"},
		{"etcd.yaml", "kind: PodDisruptionBudget", "kind: PodDisruptionBuget", "none the manifests are checked for"},
		// etcd's TLS.
		{"etcd.yaml", "--client-cert-auth=true", "--client-cert-auth=false", `--client-cert-auth="false", want "true"`},
		{"etcd.yaml", "--peer-client-cert-auth=true", "--peer-client-cert-auth=false", "--peer-client-cert-auth"},
		{"etcd.yaml", "            - --peer-cert-allowed-cn=etcd\n", "", "--peer-cert-allowed-cn"},
		{"etcd.yaml", "--listen-peer-urls=https://", "--listen-peer-urls=http://", "--listen-peer-urls \"http://0.0.0.0:2380\" is not TLS"},
		{"etcd.yaml", "etcd-2=https://", "etcd-2=http://", "--initial-cluster \"http://etcd-2.etcd:2380\" is not TLS"},
		{"etcd.yaml", "mountPath: /etc/etcd/tls", "mountPath: /etc/etcd/certs", "--cert-file \"/etc/etcd/tls/etcd.pem\" is on no mounted volume"},
		{"etcd.yaml", "secretName: etcd-tls", "secretName: etcd-tsl", `Secret "etcd-tsl"`},
		{"etcd.yaml", "path: /readyz\n              port: metrics", "path: /readyz\n              port: client", "the kubelet has no client certificate"},
		{"config.yaml", "https://etcd-1.etcd:2379", "etcd-1.etcd:2379", "without https://"},
		{"decode.yaml", "            - --etcd-key=/etc/pagewarden/tls/$(POD_NAME)-key.pem\n", "", "without --etcd-key"},
		{"gateway.yaml", "--etcd-ca=/etc/pagewarden/tls/ca.pem", "--etcd-ca=/etc/etcd/ca.pem", "--etcd-ca /etc/etcd/ca.pem is on no mounted volume"},
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
func checkOtherContainer(where string, c corev1.Container, volumes map[string]bool, bad func(string, ...any)) {
	if slices.Contains(c.Command, "etcd") {
		checkEtcd(where, c, bad)
	}
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
	for kind, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
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
	services := map[string]*corev1.Service{}
	sets := map[string]*appsv1.StatefulSet{} // by serviceName
	for _, o := range objs {
		if svc := o.service(); svc != nil {
			services[o.name] = svc
		}
		if ss := o.statefulSet(); ss != nil {
			sets[ss.Spec.ServiceName] = ss
		}
	}
	for _, o := range objs {
		cm := o.configMap()
		if cm == nil {
			continue
		}
		v, ok := cm.Data["PAGEWARDEN_ETCD"]
		if !ok {
			continue
		}
		for _, ep := range strings.Split(v, ",") {
			ep = strings.TrimSpace(ep)
			hostPort, tls := strings.CutPrefix(ep, "https://")
			hostPort = strings.TrimPrefix(hostPort, "http://")
			host, port, err := net.SplitHostPort(hostPort)
			if err != nil {
				bad("%v: PAGEWARDEN_ETCD endpoint %q: %v", o, ep, err)
				continue
			}
			pod, svc, ok := strings.Cut(host, ".")
			if !ok || services[svc] == nil {
				continue
			}
			// The manifests' etcd requires TLS with client certificates.
			if !tls {
				bad("%v: etcd endpoint %s without https://: the manifests' etcd serves clients over TLS only", o, ep)
			}
			set := sets[svc]
			if set == nil {
				bad("%v: etcd endpoint %s: Service %s is no StatefulSet's", o, ep, svc)
				continue
			}
			replicas := int32(1) // the API's default
			if set.Spec.Replicas != nil {
				replicas = *set.Spec.Replicas
			}
			i, err := strconv.Atoi(strings.TrimPrefix(pod, set.Name+"-"))
			if err != nil || !strings.HasPrefix(pod, set.Name+"-") || i < 0 || i >= int(replicas) {
				bad("%v: etcd endpoint %s names no pod of StatefulSet/%s (%d replicas)", o, ep, set.Name, replicas)
			}
			if !slices.ContainsFunc(services[svc].Spec.Ports, func(p corev1.ServicePort) bool { return strconv.Itoa(int(p.Port)) == port }) {
				bad("%v: etcd endpoint %s: port %s is not a port of Service %s", o, ep, port, svc)
			}
		}
	}
}

// checkEtcd checks the TLS of the manifests' etcd: clients and peers over
// https only, each side required to present a certificate of the CA, peers
// limited to etcd's own certificate, every file on a mounted volume, and
// probes on the plain-HTTP metrics listener (the kubelet presents no
// client certificate, so a probe of the client port would always fail).
func checkEtcd(where string, c corev1.Container, bad func(string, ...any)) {
	flags := map[string]string{}
	for _, a := range c.Args {
		if k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok {
			flags[k] = v
		}
	}
	for _, fl := range []string{"listen-client-urls", "advertise-client-urls", "listen-peer-urls", "initial-advertise-peer-urls", "initial-cluster"} {
		for _, u := range strings.Split(flags[fl], ",") {
			if _, url, _ := strings.Cut(u, "="); fl == "initial-cluster" {
				u = url
			}
			if !strings.HasPrefix(u, "https://") {
				bad("%s: --%s %q is not TLS (want https://)", where, fl, u)
			}
		}
	}
	for fl, want := range map[string]string{"client-cert-auth": "true", "peer-client-cert-auth": "true", "peer-cert-allowed-cn": "etcd"} {
		if flags[fl] != want {
			bad("%s: --%s=%q, want %q", where, fl, flags[fl], want)
		}
	}
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = true
	}
	for _, fl := range []string{"cert-file", "key-file", "trusted-ca-file", "peer-cert-file", "peer-key-file", "peer-trusted-ca-file"} {
		if v := flags[fl]; v == "" || !mounts[filepath.Dir(v)] {
			bad("%s: --%s %q is on no mounted volume", where, fl, v)
		}
	}
	plain := map[int]bool{} // ports etcd serves over plain HTTP
	for _, u := range strings.Split(flags["listen-metrics-urls"], ",") {
		if rest, ok := strings.CutPrefix(u, "http://"); ok {
			if _, p, err := net.SplitHostPort(rest); err == nil {
				n, _ := strconv.Atoi(p)
				plain[n] = true
			}
		}
	}
	for kind, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p != nil && p.HTTPGet != nil && !plain[portOf(p.HTTPGet.Port, c.Ports)] {
			bad("%s: %s probe on port %s, which etcd does not serve over plain HTTP (--listen-metrics-urls): the kubelet has no client certificate", where, kind, p.HTTPGet.Port.String())
		}
	}
}
