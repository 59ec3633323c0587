// Package v1 mirrors the few fields of the Kubernetes core/v1, apps/v1 and
// meta/v1 API types that migrate reads from a manifest. Field JSON names,
// Go types, type names and embedding follow k8s.io/api v0.34, so
// sigs.k8s.io/yaml decodes a manifest into them as it would into the real
// types, with the same error messages for the fields kept here, while vipd
// does not link k8s.io/api (about 40 packages and their init functions)
// into the daemon. Fields migrate does not read are not declared: they are
// ignored, and so not validated.
package v1

// TypeMeta is the kind and API version of an object.
type TypeMeta struct {
	Kind       string `json:"kind,omitempty"`
	APIVersion string `json:"apiVersion,omitempty"`
}

// ObjectMeta is the part of an object's metadata migrate names in messages.
type ObjectMeta struct {
	Name      string `json:"name,omitempty"`
	Namespace string `json:"namespace,omitempty"`
}

// Pod is a core/v1 Pod.
type Pod struct {
	TypeMeta   `json:",inline"`
	ObjectMeta `json:"metadata,omitempty"`
	Spec       PodSpec `json:"spec,omitempty"`
}

// DaemonSet is an apps/v1 DaemonSet.
type DaemonSet struct {
	TypeMeta   `json:",inline"`
	ObjectMeta `json:"metadata,omitempty"`
	Spec       DaemonSetSpec `json:"spec,omitempty"`
}

// DaemonSetSpec holds a DaemonSet's pod template.
type DaemonSetSpec struct {
	Template PodTemplateSpec `json:"template"`
}

// Deployment is an apps/v1 Deployment.
type Deployment struct {
	TypeMeta   `json:",inline"`
	ObjectMeta `json:"metadata,omitempty"`
	Spec       DeploymentSpec `json:"spec,omitempty"`
}

// DeploymentSpec holds a Deployment's pod template.
type DeploymentSpec struct {
	Template PodTemplateSpec `json:"template"`
}

// PodTemplateSpec is a workload's pod template.
type PodTemplateSpec struct {
	Spec PodSpec `json:"spec,omitempty"`
}

// PodSpec holds a pod's containers and volumes.
type PodSpec struct {
	Volumes    []Volume    `json:"volumes,omitempty"`
	Containers []Container `json:"containers"`
}

// Container is one container of a pod.
type Container struct {
	Name         string          `json:"name"`
	Image        string          `json:"image,omitempty"`
	Args         []string        `json:"args,omitempty"`
	EnvFrom      []EnvFromSource `json:"envFrom,omitempty"`
	Env          []EnvVar        `json:"env,omitempty"`
	VolumeMounts []VolumeMount   `json:"volumeMounts,omitempty"`
}

// EnvVar is one environment variable of a container.
type EnvVar struct {
	Name      string        `json:"name"`
	Value     string        `json:"value,omitempty"`
	ValueFrom *EnvVarSource `json:"valueFrom,omitempty"`
}

// EnvVarSource is where a variable's value comes from.
type EnvVarSource struct {
	FieldRef         *ObjectFieldSelector   `json:"fieldRef,omitempty"`
	ResourceFieldRef *ResourceFieldSelector `json:"resourceFieldRef,omitempty"`
	ConfigMapKeyRef  *ConfigMapKeySelector  `json:"configMapKeyRef,omitempty"`
	SecretKeyRef     *SecretKeySelector     `json:"secretKeyRef,omitempty"`
}

// ObjectFieldSelector selects a field of the pod.
type ObjectFieldSelector struct {
	FieldPath string `json:"fieldPath"`
}

// ResourceFieldSelector selects a container resource.
type ResourceFieldSelector struct {
	Resource string `json:"resource"`
}

// LocalObjectReference names an object in the pod's namespace.
type LocalObjectReference struct {
	Name string `json:"name,omitempty"`
}

// ConfigMapKeySelector selects a key of a ConfigMap.
type ConfigMapKeySelector struct {
	LocalObjectReference `json:",inline"`
	Key                  string `json:"key"`
}

// SecretKeySelector selects a key of a Secret.
type SecretKeySelector struct {
	LocalObjectReference `json:",inline"`
	Key                  string `json:"key"`
}

// EnvFromSource imports every key of a ConfigMap or Secret.
type EnvFromSource struct {
	ConfigMapRef *ConfigMapEnvSource `json:"configMapRef,omitempty"`
	SecretRef    *SecretEnvSource    `json:"secretRef,omitempty"`
}

// ConfigMapEnvSource names the ConfigMap of an envFrom entry.
type ConfigMapEnvSource struct {
	LocalObjectReference `json:",inline"`
}

// SecretEnvSource names the Secret of an envFrom entry.
type SecretEnvSource struct {
	LocalObjectReference `json:",inline"`
}

// VolumeMount mounts a pod volume into a container.
type VolumeMount struct {
	Name string `json:"name"`
}

// Volume is a pod volume.
type Volume struct {
	Name         string `json:"name"`
	VolumeSource `json:",inline"`
}

// VolumeSource is the kind of a volume; only hostPath is read.
type VolumeSource struct {
	HostPath *HostPathVolumeSource `json:"hostPath,omitempty"`
}

// HostPathVolumeSource is a file or directory of the node.
type HostPathVolumeSource struct {
	Path string `json:"path"`
}
