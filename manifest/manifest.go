// Package manifest renders vipd's settings as a deployable artefact: a
// kubelet static-pod manifest, or a commented env file for vipd.service.
// Both take the settings exactly as `vipd run` resolves them (flags over
// environment), through a config.Source, so what is printed is what would
// run.
package manifest

import (
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/vipd/vipd/config"
	"sigs.k8s.io/yaml"
)

// DefaultImageRepo is the image repository used when no --image is given;
// the tag is the vipd version.
const DefaultImageRepo = "ghcr.io/vipd/vipd"

// Var is one explicitly set setting.
type Var struct {
	Name  string
	Value string
}

// Given returns the settings src sets explicitly, in table order. Values
// are trimmed like config.Load trims them.
func Given(src config.Source) []Var {
	var out []Var
	for _, s := range config.Settings() {
		s := s
		if v, ok := src(&s); ok {
			out = append(out, Var{Name: s.Env, Value: strings.TrimSpace(v)})
		}
	}
	return out
}

// Validate loads vars with vipd's own loader, so a manifest is only
// generated for a configuration `vipd run` accepts. Settings not in vars
// take their defaults; VIPD_NODE_NAME defaults to this host's name as in
// `vipd run`.
func Validate(vars []Var) (*config.Config, error) {
	m := map[string]string{}
	for _, v := range vars {
		m[v.Name] = v.Value
	}
	return config.Load(func(s *config.Setting) (string, bool) {
		v, ok := m[s.Env]
		return v, ok
	})
}

// PodOptions are the static pod's own knobs (not vipd settings).
type PodOptions struct {
	// Image is the container image; empty: DefaultImageRepo:Version.
	Image string
	// Version is vipd's version, used for the default image tag.
	Version string
	// Name and Namespace of the Pod; empty: vipd and kube-system.
	Name      string
	Namespace string
}

// fileSettings are path settings whose files must be visible inside the
// container: each is mounted read-only from the host at the same path.
var fileSettings = []string{"VIPD_HEALTH_CA_FILE", "VIPD_GOSSIP_KEY_FILE", "VIPD_SA_TOKEN_PATH", "VIPD_DO_TOKEN_FILE", "VIPD_KUBECONFIG"}

// ImageTag is the tag `make image` gives the image of vipd version: the
// version with each character an image tag may not hold ('+', '~', ...)
// turned into '-', and "latest" for a development build.
func ImageTag(version string) string {
	if version == "" || version == "dev" {
		return "latest"
	}
	b := []byte(version)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			b[i] = '-'
		}
	}
	if len(b) > 128 {
		b = b[:128]
	}
	return string(b)
}

// StaticPod builds a kubelet static Pod that runs `vipd run` with vars as
// its environment. vars must already be valid (see Validate). Secret
// settings are refused: a static pod's env is published in its mirror Pod
// to everyone who may read Pods in the namespace.
func StaticPod(vars []Var, opts PodOptions) (*Pod, error) {
	name := orDefault(opts.Name, "vipd")
	ns := orDefault(opts.Namespace, "kube-system")
	image := opts.Image
	if image == "" {
		image = DefaultImageRepo + ":" + ImageTag(opts.Version)
	}
	stateDir := ""
	if s, ok := config.Lookup("VIPD_STATE_DIR"); ok {
		stateDir = s.Default
	}
	var env []EnvVar
	hasNodeName := false
	var mounts []VolumeMount
	var volumes []Volume
	for _, v := range vars {
		s, ok := config.Lookup(v.Name)
		if !ok {
			return nil, fmt.Errorf("%s is not a vipd setting", v.Name)
		}
		if s.Secret && v.Value != "" {
			return nil, fmt.Errorf("%s would be readable in the mirror Pod of a static pod by anyone who can read Pods in %s: put the token in a file and use the *_FILE setting instead", v.Name, ns)
		}
		switch v.Name {
		case "VIPD_NODE_NAME":
			hasNodeName = v.Value != ""
		case "VIPD_STATE_DIR":
			if v.Value != "" {
				stateDir = v.Value
			}
		}
		if v.Name == "VIPD_NODE_NAME" && v.Value == "" {
			continue
		}
		env = append(env, EnvVar{Name: v.Name, Value: v.Value})
		for i, fs := range fileSettings {
			if v.Name == fs && v.Value != "" {
				vol := fmt.Sprintf("file-%d", i)
				t := HostPathFile
				if v.Name == "VIPD_SA_TOKEN_PATH" {
					// The token may appear only after bootstrap.
					t = HostPathUnset
				}
				volumes = append(volumes, Volume{Name: vol, HostPath: &HostPathVolumeSource{Path: v.Value, Type: &t}})
				mounts = append(mounts, VolumeMount{Name: vol, MountPath: v.Value, ReadOnly: true})
			}
		}
	}
	if !hasNodeName {
		// The kubelet's node name, the same as the host name vipd run
		// would use unless kubelet overrides it.
		env = append(env, EnvVar{Name: "VIPD_NODE_NAME", ValueFrom: &EnvVarSource{
			FieldRef: &ObjectFieldSelector{APIVersion: "v1", FieldPath: "spec.nodeName"}}})
	}
	if stateDir == "" || !path.IsAbs(stateDir) {
		return nil, errors.New("VIPD_STATE_DIR must be an absolute path")
	}
	dirType := HostPathDirectoryOrCreate
	volumes = append([]Volume{{Name: "state", HostPath: &HostPathVolumeSource{Path: stateDir, Type: &dirType}}}, volumes...)
	mounts = append([]VolumeMount{{Name: "state", MountPath: stateDir}}, mounts...)

	// VIPD_MEMORY_LOCK=on (VIPD_PROFILE=fast sets it) locks vipd's pages in
	// RAM: mlockall needs IPC_LOCK in a container, whose memlock limit
	// is not unlimited (vipd.service sets LimitMEMLOCK=infinity instead).
	caps := []Capability{"NET_ADMIN", "NET_RAW", "NET_BIND_SERVICE"}
	if c, err := Validate(vars); err == nil && c.MemoryLock == "on" {
		caps = append(caps, "IPC_LOCK")
	}
	no, yes := false, true
	var root int64
	pod := &Pod{
		APIVersion: "v1", Kind: "Pod",
		Metadata: ObjectMeta{
			Name: name, Namespace: ns,
			Labels: map[string]string{"app.kubernetes.io/name": "vipd", "app.kubernetes.io/component": "control-plane-vip"},
		},
		Spec: PodSpec{
			HostNetwork:       true,
			PriorityClassName: "system-node-critical",
			Containers: []Container{{
				Name:            "vipd",
				Image:           image,
				ImagePullPolicy: PullIfNotPresent,
				Args:            []string{"run"},
				Env:             env,
				SecurityContext: &SecurityContext{
					Capabilities: &Capabilities{
						Add:  caps,
						Drop: []Capability{"ALL"},
					},
					RunAsUser:                &root,
					AllowPrivilegeEscalation: &no,
					ReadOnlyRootFilesystem:   &yes,
				},
				VolumeMounts: mounts,
			}},
			Volumes: volumes,
			// vipd releases the VIP within a second of SIGTERM.
			TerminationGracePeriodSeconds: ptr(int64(5)),
		},
	}
	return pod, nil
}

func ptr[T any](v T) *T { return &v }

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

// WritePod writes pod as YAML, with a header comment saying where it goes.
func WritePod(w io.Writer, pod *Pod) error {
	b, err := yaml.Marshal(pod)
	if err != nil {
		return fmt.Errorf("encode pod: %w", err)
	}
	header := "# vipd static pod: save as /etc/kubernetes/manifests/vipd.yaml on each control-plane node.\n" +
		"# Generated by `vipd manifest static-pod`; the env holds the settings given to it.\n"
	if _, err := io.WriteString(w, header+string(b)); err != nil {
		return fmt.Errorf("write pod: %w", err)
	}
	return nil
}

// WriteEnv writes the commented env file for /etc/vipd/vipd.env with vars
// as active lines and every other setting as a commented default.
func WriteEnv(w io.Writer, vars []Var) error {
	set := map[string]string{}
	for _, v := range vars {
		set[v.Name] = v.Value
	}
	if err := config.WriteEnvFile(w, set); err != nil {
		return fmt.Errorf("write env file: %w", err)
	}
	return nil
}
