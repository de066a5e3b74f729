package cli

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The Dockerfile is checked here rather than by building it (CI has no
// container runtime): its build stage must build the way the README says
// (so the image holds the binary the README and the tests describe), its
// Go is go.mod's, its runtime stage is a static base run by a non-root
// user, its entrypoint is the binary it copied, and the image it is built
// as is the one the manifests run. Without -short the README's command is
// run and the binary checked to be static (no interpreter, no shared
// libraries), which is what lets the runtime image have no libc.

const (
	repoRoot = "../.."
	// image is the name the README builds and the manifests run.
	image = "pagewarden:dev"
)

// shellWords splits a command line the way sh would for the simple forms
// the Dockerfile and README use: blanks separate words, quotes group and
// are removed.
func shellWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	in, quote := false, byte(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0 && c == quote:
			quote = 0
		case quote != 0:
			cur.WriteByte(c)
		case c == '"' || c == '\'':
			quote, in = c, true
		case c == ' ' || c == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c in %q", quote, s)
	}
	if in {
		words = append(words, cur.String())
	}
	return words, nil
}

// goBuild is one `VAR=value ... go build FLAGS -o OUT PACKAGE` command.
type goBuild struct {
	env   map[string]string
	flags []string // in order, without -o and its value
	out   string
	pkg   string
}

func parseGoBuild(line string) (goBuild, error) {
	words, err := shellWords(line)
	if err != nil {
		return goBuild{}, err
	}
	b := goBuild{env: map[string]string{}}
	i := 0
	for ; i < len(words); i++ {
		k, v, ok := strings.Cut(words[i], "=")
		if !ok || !regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`).MatchString(k) {
			break
		}
		b.env[k] = v
	}
	if i+1 >= len(words) || words[i] != "go" || words[i+1] != "build" {
		return b, fmt.Errorf("%q is not [VAR=value...] go build ...", line)
	}
	rest := words[i+2:]
	for j := 0; j < len(rest); j++ {
		switch w := rest[j]; {
		case w == "-o" && j+1 < len(rest):
			b.out = rest[j+1]
			j++
		case strings.HasPrefix(w, "-"):
			b.flags = append(b.flags, w)
		case b.pkg == "":
			b.pkg = w
		default:
			return b, fmt.Errorf("%q: two packages (%s, %s)", line, b.pkg, w)
		}
	}
	if b.out == "" || b.pkg == "" {
		return b, fmt.Errorf("%q: want -o OUT and one package", line)
	}
	return b, nil
}

// readmeBuild returns the go build command and the docker build tag of the
// README's shell blocks.
func readmeBuild(readme []byte) (goBuild, string, error) {
	var build *goBuild
	tag := ""
	inCode := false
	sc := bufio.NewScanner(bytes.NewReader(readme))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if !inCode {
			continue
		}
		cmd, _, _ := strings.Cut(line, "#")
		if strings.Contains(cmd, "go build ") && build == nil {
			b, err := parseGoBuild(strings.TrimSpace(cmd))
			if err != nil {
				return goBuild{}, "", err
			}
			build = &b
		}
		if w, _ := shellWords(cmd); len(w) >= 4 && w[0] == "docker" && w[1] == "build" && tag == "" {
			if i := slices.Index(w, "-t"); i > 0 && i+1 < len(w) {
				tag = w[i+1]
			}
		}
	}
	if build == nil || tag == "" {
		return goBuild{}, "", fmt.Errorf("the README has no go build command (%v) or docker build -t (%q)", build != nil, tag)
	}
	return *build, tag, nil
}

// dockerInstr is one Dockerfile instruction, continuation lines joined.
type dockerInstr struct {
	op, args string
	line     int
}

func parseDockerfile(b []byte) ([]dockerInstr, error) {
	var out []dockerInstr
	var cur strings.Builder
	start := 0
	for i, raw := range strings.Split(string(b), "\n") {
		line := strings.TrimSpace(raw)
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if cont, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(line)
		op, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, dockerInstr{op: strings.ToUpper(op), args: strings.TrimSpace(args), line: start})
		cur.Reset()
	}
	if cur.Len() > 0 {
		return nil, fmt.Errorf("line %d: continued past the end", start)
	}
	return out, nil
}

// goLine is go.mod's go directive.
func goLine(gomod []byte) string {
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(gomod)
	if m == nil {
		return ""
	}
	return string(m[1])
}

// checkDockerfile returns every problem it finds; files holds Dockerfile,
// README.md, go.mod and the manifests' images.
func checkDockerfile(dockerfile, readme, gomod []byte, manifestImages []string) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	want, tag, err := readmeBuild(readme)
	if err != nil {
		return []string{err.Error()}
	}
	if tag != image {
		bad("README builds the image as %q, the manifests run %q", tag, image)
	}
	for _, im := range manifestImages {
		if im != image {
			bad("a manifest runs %q, not the image the README builds (%s)", im, image)
		}
	}
	instrs, err := parseDockerfile(dockerfile)
	if err != nil {
		return append(problems, "Dockerfile: "+err.Error())
	}
	type stage struct {
		from, name     string
		builds         []goBuild
		user           string
		entry          []string
		copiedFromTo   map[string]string // --from=stage source → destination
		line, buildLn  int
		copiedFromName string
	}
	var stages []*stage
	for _, in := range instrs {
		if in.op == "FROM" {
			w := strings.Fields(in.args)
			// As hadolint's DL3006/DL3007 (it is not packaged where CI
			// runs): a base is pinned to a version, never latest.
			last := w[0][strings.LastIndex(w[0], "/")+1:] // a registry's host:port is not a tag
			if _, tag, ok := strings.Cut(last, ":"); w[0] != "scratch" && !strings.Contains(w[0], "@sha256:") && (!ok || tag == "latest") {
				bad("Dockerfile:%d: FROM %s: pin the base image to a tag or digest, not latest", in.line, w[0])
			}
			s := &stage{from: w[0], line: in.line, copiedFromTo: map[string]string{}}
			if len(w) == 3 && strings.EqualFold(w[1], "AS") {
				s.name = w[2]
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) == 0 {
			if in.op != "ARG" {
				bad("Dockerfile:%d: %s before FROM", in.line, in.op)
			}
			continue
		}
		s := stages[len(stages)-1]
		switch in.op {
		case "RUN":
			if strings.Contains(in.args, "go build") {
				b, err := parseGoBuild(in.args)
				if err != nil {
					bad("Dockerfile:%d: %v", in.line, err)
					continue
				}
				s.builds = append(s.builds, b)
				s.buildLn = in.line
			}
		case "USER":
			s.user = in.args
		case "ENTRYPOINT", "CMD":
			if !strings.HasPrefix(in.args, "[") {
				bad("Dockerfile:%d: %s in shell form (signals would go to a shell, and the runtime image has none)", in.line, in.op)
				continue
			}
			if in.op == "CMD" {
				continue
			}
			s.entry, _ = shellWords(strings.NewReplacer("[", "", "]", "", ",", " ").Replace(in.args))
		case "COPY":
			w := strings.Fields(in.args)
			if from, ok := strings.CutPrefix(w[0], "--from="); ok && len(w) == 3 {
				s.copiedFromName = from
				s.copiedFromTo[w[1]] = w[2]
			}
		}
	}
	if len(stages) < 2 {
		return append(problems, fmt.Sprintf("Dockerfile: %d stage(s), want a build stage and a runtime stage", len(stages)))
	}
	// The build stage: go.mod's Go, and the README's build.
	var build *stage
	for _, s := range stages {
		if len(s.builds) > 0 {
			build = s
		}
	}
	if build == nil {
		return append(problems, "Dockerfile: no stage runs go build")
	}
	if v, ok := strings.CutPrefix(build.from, "golang:"); !ok || strings.SplitN(v, "-", 2)[0] != goLine(gomod) {
		bad("Dockerfile:%d: build stage FROM %s, want golang:%s (go.mod's go line)", build.line, build.from, goLine(gomod))
	}
	got := build.builds[0]
	if !maps.Equal(got.env, want.env) {
		bad("Dockerfile:%d: go build environment %v, README's %v", build.buildLn, got.env, want.env)
	}
	if !slices.Equal(got.flags, want.flags) {
		bad("Dockerfile:%d: go build flags %q, README's %q", build.buildLn, got.flags, want.flags)
	}
	if got.pkg != want.pkg {
		bad("Dockerfile:%d: builds %s, README builds %s", build.buildLn, got.pkg, want.pkg)
	}
	// The runtime stage: a static base, the built binary as entrypoint, a
	// non-root numeric user.
	rt := stages[len(stages)-1]
	if rt == build {
		return append(problems, "Dockerfile: the last stage is the build stage; the image would carry the toolchain")
	}
	if !strings.HasPrefix(rt.from, "gcr.io/distroless/static") && rt.from != "scratch" {
		bad("Dockerfile:%d: runtime stage FROM %s, want distroless/static or scratch (the binary is static)", rt.line, rt.from)
	}
	if rt.copiedFromName != build.name {
		bad("Dockerfile: the runtime stage copies from %q, not the build stage %q", rt.copiedFromName, build.name)
	}
	dest, ok := rt.copiedFromTo[got.out]
	if !ok {
		bad("Dockerfile: the runtime stage does not copy the built %s (copies %v)", got.out, rt.copiedFromTo)
	}
	if len(rt.entry) == 0 || rt.entry[0] != dest {
		bad("Dockerfile: ENTRYPOINT %q, want the copied binary %s", rt.entry, dest)
	}
	uid, _, _ := strings.Cut(rt.user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		bad("Dockerfile: runtime USER %q, want a numeric non-root UID (runAsNonRoot can verify only a number)", rt.user)
	}
	return problems
}

// manifestImages returns the image of every pagewarden container in the
// manifests, and the kustomization's images entry as NAME:TAG.
func manifestImages(t *testing.T) []string {
	t.Helper()
	var images []string
	for _, o := range decodeManifests(t, readManifests(t)) {
		if o.pod != nil {
			for _, c := range o.pod.Spec.Containers {
				if isPagewarden(c.Image) {
					images = append(images, c.Image)
				}
			}
		}
		if k := o.kustomization(); k != nil {
			for _, im := range k.Images {
				if im.Name == "pagewarden" {
					images = append(images, im.NewName+":"+im.NewTag)
				}
			}
		}
	}
	if len(images) == 0 {
		t.Fatal("no pagewarden image in the manifests")
	}
	return images
}

func TestDockerfile(t *testing.T) {
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(repoRoot, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	dockerfile, readme, gomod := read("Dockerfile"), read("README.md"), read("go.mod")
	images := manifestImages(t)
	for _, p := range checkDockerfile(dockerfile, readme, gomod, images) {
		t.Error(p)
	}
	for _, tc := range []struct{ old, new, says string }{
		{`-ldflags="-s -w"`, `-ldflags="-s"`, "go build flags"},
		{"CGO_ENABLED=0 go build", "go build", "go build environment"},
		{"CGO_ENABLED=0 go build", "CGO_ENABLED=1 go build", "go build environment"},
		{"./cmd/pagewarden\n", "./cmd/pagewarden/...\n", "README builds"},
		{"FROM golang:1.26.8-bookworm", "FROM golang:1.25-bookworm", "go.mod's go line"},
		{"FROM gcr.io/distroless/static-debian12:nonroot", "FROM debian:bookworm-slim", "want distroless/static"},
		{"USER 65532:65532", "USER root", "non-root UID"},
		{"USER 65532:65532", "USER 0", "non-root UID"},
		{`ENTRYPOINT ["/usr/local/bin/pagewarden"]`, `ENTRYPOINT ["/pagewarden"]`, "want the copied binary"},
		{`ENTRYPOINT ["/usr/local/bin/pagewarden"]`, `ENTRYPOINT /usr/local/bin/pagewarden`, "shell form"},
		{"COPY --from=build /out/pagewarden", "COPY --from=build /out/pw", "does not copy the built"},
		{"FROM golang:1.26.8-bookworm", "FROM golang", "pin the base image"},
		{"FROM gcr.io/distroless/static-debian12:nonroot", "FROM gcr.io/distroless/static-debian12:latest", "pin the base image"},
		{`CMD ["serve", "--listen=0.0.0.0:8080"]`, `CMD serve --listen=0.0.0.0:8080`, "CMD in shell form"},
	} {
		t.Run(tc.new, func(t *testing.T) {
			if !bytes.Contains(dockerfile, []byte(tc.old)) {
				t.Fatalf("Dockerfile does not contain %q", tc.old)
			}
			broken := bytes.Replace(dockerfile, []byte(tc.old), []byte(tc.new), 1)
			if ps := checkDockerfile(broken, readme, gomod, images); !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, tc.says) }) {
				t.Errorf("no problem saying %q; got %q", tc.says, ps)
			}
		})
	}
	t.Run("manifest image", func(t *testing.T) {
		ps := checkDockerfile(dockerfile, readme, gomod, append(slices.Clone(images), "ghcr.io/pagewarden/pagewarden:latest"))
		if !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, "not the image the README builds") }) {
			t.Errorf("a manifest with another image passed: %q", ps)
		}
	})
	t.Run("README tag", func(t *testing.T) {
		ps := checkDockerfile(dockerfile, bytes.Replace(readme, []byte("docker build -t pagewarden:dev"), []byte("docker build -t pagewarden:latest"), 1), gomod, images)
		if !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, "README builds the image") }) {
			t.Errorf("another README tag passed: %q", ps)
		}
	})
}

// TestReadmeBuildIsStatic runs the README's build and checks that the
// binary is static: no program interpreter and no shared library, so the
// distroless/static image (no libc) can run it.
func TestReadmeBuildIsStatic(t *testing.T) {
	if testing.Short() {
		t.Skip("links the whole binary; skipped with -short")
	}
	readme, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := readmeBuild(readme)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "pagewarden")
	cmd := exec.Command("go", slices.Concat([]string{"build"}, b.flags, []string{"-o", out, b.pkg})...)
	cmd.Dir = repoRoot
	cmd.Env = os.Environ()
	for k, v := range b.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, msg)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Skipf("not an ELF binary on this platform: %v", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("the binary asks for a program interpreter: it is not static")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %v", libs)
	}
	if v, err := exec.Command(out, "version").CombinedOutput(); err != nil || !bytes.HasPrefix(v, []byte("pagewarden ")) {
		t.Errorf("%s version: %v\n%s", out, err, v)
	}
}
