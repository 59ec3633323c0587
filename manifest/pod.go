package manifest

// The Pod types below carry only what StaticPod sets, with the JSON names
// and omitempty rules of the Kubernetes core/v1 API (k8s.io/api v0.34), so
// the YAML is what the API types would print and decodes strictly into a
// v1.Pod. They keep k8s.io/api, about 40 packages with init functions,
// out of the vipd binary.

// Pod is a core/v1 Pod as a static-pod manifest needs it.
type Pod struct {
	APIVersion string     `json:"apiVersion,omitempty"`
	Kind       string     `json:"kind,omitempty"`
	Metadata   ObjectMeta `json:"metadata"`
	Spec       PodSpec    `json:"spec"`
}

// ObjectMeta is the Pod's name, namespace and labels.
type ObjectMeta struct {
	Name      string            `json:"name,omitempty"`
	Namespace string            `json:"namespace,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

// PodSpec is the part of a Pod spec StaticPod sets.
type PodSpec struct {
	Volumes                       []Volume    `json:"volumes,omitempty"`
	Containers                    []Container `json:"containers"`
	TerminationGracePeriodSeconds *int64      `json:"terminationGracePeriodSeconds,omitempty"`
	HostNetwork                   bool        `json:"hostNetwork,omitempty"`
	PriorityClassName             string      `json:"priorityClassName,omitempty"`
}

// PullPolicy is a container's imagePullPolicy.
type PullPolicy string

// PullIfNotPresent pulls the image only when the node does not have it.
const PullIfNotPresent PullPolicy = "IfNotPresent"

// Container is a Pod's container.
type Container struct {
	Name            string           `json:"name"`
	Image           string           `json:"image,omitempty"`
	Args            []string         `json:"args,omitempty"`
	Env             []EnvVar         `json:"env,omitempty"`
	VolumeMounts    []VolumeMount    `json:"volumeMounts,omitempty"`
	ImagePullPolicy PullPolicy       `json:"imagePullPolicy,omitempty"`
	SecurityContext *SecurityContext `json:"securityContext,omitempty"`
}

// EnvVar is an environment variable: a value, or one taken from the Pod.
type EnvVar struct {
	Name      string        `json:"name"`
	Value     string        `json:"value,omitempty"`
	ValueFrom *EnvVarSource `json:"valueFrom,omitempty"`
}

// EnvVarSource takes a variable's value from a field of the Pod.
type EnvVarSource struct {
	FieldRef *ObjectFieldSelector `json:"fieldRef,omitempty"`
}

// ObjectFieldSelector names a field of the Pod, e.g. spec.nodeName.
type ObjectFieldSelector struct {
	APIVersion string `json:"apiVersion,omitempty"`
	FieldPath  string `json:"fieldPath"`
}

// VolumeMount mounts a volume into the container.
type VolumeMount struct {
	Name      string `json:"name"`
	ReadOnly  bool   `json:"readOnly,omitempty"`
	MountPath string `json:"mountPath"`
}

// Volume is a hostPath volume (the only kind a static pod of vipd uses).
type Volume struct {
	Name     string                `json:"name"`
	HostPath *HostPathVolumeSource `json:"hostPath,omitempty"`
}

// HostPathType is what must exist at a hostPath.
type HostPathType string

// The hostPath types StaticPod uses.
const (
	// HostPathUnset checks nothing: the path may appear later.
	HostPathUnset HostPathType = ""
	// HostPathDirectoryOrCreate creates an empty directory if needed.
	HostPathDirectoryOrCreate HostPathType = "DirectoryOrCreate"
	// HostPathFile requires an existing file.
	HostPathFile HostPathType = "File"
)

// HostPathVolumeSource is a file or directory of the node.
type HostPathVolumeSource struct {
	Path string        `json:"path"`
	Type *HostPathType `json:"type,omitempty"`
}

// Capability is a Linux capability name without the CAP_ prefix.
type Capability string

// Capabilities are added to and dropped from the container.
type Capabilities struct {
	Add  []Capability `json:"add,omitempty"`
	Drop []Capability `json:"drop,omitempty"`
}

// SecurityContext is the container's security settings.
type SecurityContext struct {
	Capabilities             *Capabilities `json:"capabilities,omitempty"`
	RunAsUser                *int64        `json:"runAsUser,omitempty"`
	ReadOnlyRootFilesystem   *bool         `json:"readOnlyRootFilesystem,omitempty"`
	AllowPrivilegeEscalation *bool         `json:"allowPrivilegeEscalation,omitempty"`
}
