package migrate

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"unicode/utf8"

	kubev1 "github.com/vipd/vipd/migrate/internal/kube/v1"
	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"
)

// maxInput bounds what we read: a manifest is a few kilobytes.
const maxInput = 4 << 20

// variable is one environment variable of the source configuration.
type variable struct {
	Name  string
	Value string
	// FieldPath is set when the value came from valueFrom.fieldRef.
	FieldPath string
	// External names a Secret or ConfigMap key the value came from; the
	// value itself is unknown.
	External string
	// Line is the 1-based line of the variable in an env list, 0 for YAML.
	Line int
	// Flag is the command-line flag the value came from, if any.
	Flag string
}

// source is the configuration found in the input, whatever its format.
type source struct {
	// Describe says what was read, e.g. `static Pod "kube-system/kube-vip"`.
	Describe string
	Vars     []variable
	// Args are the container's args (kube-vip flags), if any.
	Args []string
	// Image is the container image, if known.
	Image string
	// HostPaths are the hostPath volumes mounted into the container.
	HostPaths []string
	// Notes are remarks about the input itself (other workloads skipped).
	Notes []string
}

func (s *source) lookup(name string) (variable, bool) {
	// The last definition wins, as in a container's env and in a shell.
	for i := len(s.Vars) - 1; i >= 0; i-- {
		if s.Vars[i].Name == name {
			return s.Vars[i], true
		}
	}
	return variable{}, false
}

func readAll(r io.Reader) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxInput+1))
	if err != nil {
		return nil, fmt.Errorf("read input: %w", err)
	}
	if len(data) > maxInput {
		return nil, fmt.Errorf("read input: larger than %d bytes, not a manifest or env file", maxInput)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("read input: empty: expected a Pod or DaemonSet manifest or NAME=VALUE lines")
	}
	if bytes.IndexByte(data, 0) >= 0 {
		return nil, errors.New("read input: binary data (NUL byte): expected a Pod or DaemonSet manifest or NAME=VALUE lines")
	}
	if !utf8.Valid(data) {
		// A value that is not UTF-8 could not be written back unchanged,
		// and systemd ignores such variables in an EnvironmentFile.
		i := 0
		for i < len(data) {
			r, n := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && n == 1 {
				break
			}
			i += n
		}
		return nil, fmt.Errorf("line %d: invalid UTF-8 (byte 0x%02x): expected a Pod or DaemonSet manifest or NAME=VALUE lines in UTF-8", bytes.Count(data[:i], []byte("\n"))+1, data[i])
	}
	return data, nil
}

var envLineRE = regexp.MustCompile(`^(export[ \t]+)?[A-Za-z_][A-Za-z0-9_]*[ \t]*=`)

// looksLikeEnvList reports whether the first meaningful line is NAME=VALUE.
func looksLikeEnvList(data []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), maxInput)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		return envLineRE.MatchString(l)
	}
	return false
}

// parseEnvList reads NAME=VALUE lines: blank lines and # comments are
// skipped, an "export " prefix is allowed, values may be quoted.
func parseEnvList(data []byte) (*source, error) {
	src := &source{Describe: "env list"}
	lines := strings.Split(string(data), "\n")
	for i, raw := range lines {
		n := i + 1
		l := strings.TrimSpace(strings.TrimSuffix(raw, "\r"))
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if !envLineRE.MatchString(l) {
			return nil, fmt.Errorf("line %d: expected NAME=VALUE, got %q", n, truncate(l, 60))
		}
		l = strings.TrimSpace(strings.TrimPrefix(l, "export"))
		name, value, _ := strings.Cut(l, "=")
		name = strings.TrimSpace(name)
		value, err := unquote(strings.TrimSpace(value))
		if err != nil {
			return nil, fmt.Errorf("line %d: %s: %w", n, name, err)
		}
		src.Vars = append(src.Vars, variable{Name: name, Value: value, Line: n})
	}
	return src, nil
}

func unquote(v string) (string, error) {
	if v == "" {
		return v, nil
	}
	switch q := v[0]; q {
	case '"', '\'':
		if len(v) < 2 || v[len(v)-1] != q {
			return "", fmt.Errorf("unterminated %c quote in %q", q, truncate(v, 60))
		}
		inner := v[1 : len(v)-1]
		if q == '\'' {
			return inner, nil
		}
		var b strings.Builder
		for i := 0; i < len(inner); i++ {
			c := inner[i]
			if c == '\\' && i+1 < len(inner) {
				i++
				switch inner[i] {
				case 'n':
					b.WriteByte('\n')
				default:
					b.WriteByte(inner[i])
				}
				continue
			}
			b.WriteByte(c)
		}
		return b.String(), nil
	}
	// An unquoted value ends at " #" (a trailing comment).
	if i := strings.Index(v, " #"); i >= 0 {
		v = strings.TrimSpace(v[:i])
	}
	return v, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// workload is a Pod template found in a manifest.
type workload struct {
	describe string
	spec     kubev1.PodSpec
}

// parseManifests reads a YAML stream (one or more documents) and returns
// the pod specs of the Pods, DaemonSets and Deployments in it.
func parseManifests(data []byte) ([]workload, []string, error) {
	dec := yamlv3.NewDecoder(bytes.NewReader(data))
	var out []workload
	var skipped []string
	for doc := 1; ; doc++ {
		var node yamlv3.Node
		err := dec.Decode(&node)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s (document %d)", yamlError(err), doc)
		}
		if node.Kind == 0 || len(node.Content) == 0 || node.Content[0].Kind == yamlv3.ScalarNode && node.Content[0].Tag == "!!null" {
			continue // an empty document between "---" separators
		}
		line := node.Content[0].Line
		if node.Content[0].Kind != yamlv3.MappingNode {
			return nil, nil, fmt.Errorf("line %d: expected a Kubernetes object (a YAML mapping with kind:) or NAME=VALUE lines", line)
		}
		raw, err := yamlv3.Marshal(&node)
		if err != nil {
			return nil, nil, fmt.Errorf("line %d: re-encode document %d: %w", line, doc, err)
		}
		var tm kubev1.TypeMeta
		if err := yaml.Unmarshal(raw, &tm); err != nil {
			return nil, nil, fmt.Errorf("line %d: document %d: %w", line, doc, err)
		}
		var om struct {
			Metadata kubev1.ObjectMeta `json:"metadata"`
		}
		_ = yaml.Unmarshal(raw, &om) // best effort: only used in messages
		name := om.Metadata.Name
		if om.Metadata.Namespace != "" {
			name = om.Metadata.Namespace + "/" + name
		}
		switch tm.Kind {
		case "Pod":
			var p kubev1.Pod
			if err := yaml.Unmarshal(raw, &p); err != nil {
				return nil, nil, fmt.Errorf("line %d: Pod %q: %w", line, name, err)
			}
			out = append(out, workload{describe: fmt.Sprintf("Pod %q", name), spec: p.Spec})
		case "DaemonSet":
			var d kubev1.DaemonSet
			if err := yaml.Unmarshal(raw, &d); err != nil {
				return nil, nil, fmt.Errorf("line %d: DaemonSet %q: %w", line, name, err)
			}
			out = append(out, workload{describe: fmt.Sprintf("DaemonSet %q", name), spec: d.Spec.Template.Spec})
		case "Deployment":
			var d kubev1.Deployment
			if err := yaml.Unmarshal(raw, &d); err != nil {
				return nil, nil, fmt.Errorf("line %d: Deployment %q: %w", line, name, err)
			}
			out = append(out, workload{describe: fmt.Sprintf("Deployment %q", name), spec: d.Spec.Template.Spec})
		case "":
			return nil, nil, fmt.Errorf("line %d: document %d has no kind: expected a Pod, DaemonSet or Deployment manifest, or NAME=VALUE lines", line, doc)
		default:
			skipped = append(skipped, fmt.Sprintf("%s %q", tm.Kind, name))
		}
	}
	return out, skipped, nil
}

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlError rewrites "yaml: line N: msg" as "line N: msg".
func yamlError(err error) string {
	msg := err.Error()
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		return "line " + m[1] + ": invalid YAML: " + m[2]
	}
	return "invalid YAML: " + strings.TrimPrefix(msg, "yaml: ")
}

// containerSource extracts the env, args, image and hostPath mounts of c.
func containerSource(w workload, c kubev1.Container) *source {
	src := &source{Describe: fmt.Sprintf("%s container %q", w.describe, c.Name), Image: c.Image, Args: append([]string(nil), c.Args...)}
	for _, e := range c.Env {
		v := variable{Name: e.Name, Value: e.Value}
		if e.ValueFrom != nil {
			switch vf := e.ValueFrom; {
			case vf.FieldRef != nil:
				v.FieldPath = vf.FieldRef.FieldPath
			case vf.SecretKeyRef != nil:
				v.External = fmt.Sprintf("Secret %q key %q", vf.SecretKeyRef.Name, vf.SecretKeyRef.Key)
			case vf.ConfigMapKeyRef != nil:
				v.External = fmt.Sprintf("ConfigMap %q key %q", vf.ConfigMapKeyRef.Name, vf.ConfigMapKeyRef.Key)
			case vf.ResourceFieldRef != nil:
				v.External = fmt.Sprintf("resource field %q", vf.ResourceFieldRef.Resource)
			default:
				v.External = "a valueFrom source"
			}
		}
		src.Vars = append(src.Vars, v)
	}
	for _, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			src.Notes = append(src.Notes, fmt.Sprintf("envFrom ConfigMap %q was not read: add its variables by hand", ef.ConfigMapRef.Name))
		case ef.SecretRef != nil:
			src.Notes = append(src.Notes, fmt.Sprintf("envFrom Secret %q was not read: add its variables by hand", ef.SecretRef.Name))
		}
	}
	mounted := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounted[m.Name] = true
	}
	for _, v := range w.spec.Volumes {
		if v.HostPath != nil && mounted[v.Name] {
			src.HostPaths = append(src.HostPaths, v.HostPath.Path)
		}
	}
	return src
}
