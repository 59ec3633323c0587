package v1

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The real API types are only linked into this test: the point of the
// package is that migrate decodes manifests the same way without them.

func sliceOf[S, D any](src []S, conv func(S) D) []D {
	if src == nil {
		return nil
	}
	out := make([]D, len(src))
	for i, s := range src {
		out[i] = conv(s)
	}
	return out
}

// project copies the fields this package declares out of a real PodSpec.
func project(s corev1.PodSpec) PodSpec {
	return PodSpec{
		Volumes: sliceOf(s.Volumes, func(v corev1.Volume) Volume {
			out := Volume{Name: v.Name}
			if v.HostPath != nil {
				out.HostPath = &HostPathVolumeSource{Path: v.HostPath.Path}
			}
			return out
		}),
		Containers: sliceOf(s.Containers, func(c corev1.Container) Container {
			return Container{
				Name: c.Name, Image: c.Image, Args: c.Args,
				EnvFrom: sliceOf(c.EnvFrom, func(e corev1.EnvFromSource) EnvFromSource {
					var out EnvFromSource
					if e.ConfigMapRef != nil {
						out.ConfigMapRef = &ConfigMapEnvSource{LocalObjectReference{Name: e.ConfigMapRef.Name}}
					}
					if e.SecretRef != nil {
						out.SecretRef = &SecretEnvSource{LocalObjectReference{Name: e.SecretRef.Name}}
					}
					return out
				}),
				Env: sliceOf(c.Env, func(e corev1.EnvVar) EnvVar {
					out := EnvVar{Name: e.Name, Value: e.Value}
					if vf := e.ValueFrom; vf != nil {
						out.ValueFrom = &EnvVarSource{}
						if vf.FieldRef != nil {
							out.ValueFrom.FieldRef = &ObjectFieldSelector{FieldPath: vf.FieldRef.FieldPath}
						}
						if vf.ResourceFieldRef != nil {
							out.ValueFrom.ResourceFieldRef = &ResourceFieldSelector{Resource: vf.ResourceFieldRef.Resource}
						}
						if vf.ConfigMapKeyRef != nil {
							out.ValueFrom.ConfigMapKeyRef = &ConfigMapKeySelector{LocalObjectReference{Name: vf.ConfigMapKeyRef.Name}, vf.ConfigMapKeyRef.Key}
						}
						if vf.SecretKeyRef != nil {
							out.ValueFrom.SecretKeyRef = &SecretKeySelector{LocalObjectReference{Name: vf.SecretKeyRef.Name}, vf.SecretKeyRef.Key}
						}
					}
					return out
				}),
				VolumeMounts: sliceOf(c.VolumeMounts, func(m corev1.VolumeMount) VolumeMount { return VolumeMount{Name: m.Name} }),
			}
		}),
	}
}

// compare decodes doc into the real type R and the local type L and
// checks: whatever the real type accepts, the local one accepts with the
// same values; whatever the local type rejects, the real one rejects.
func compare[R, L any](t *testing.T, doc []byte, real func(*R) any, local func(*L) any) {
	t.Helper()
	var r R
	var l L
	errR := yaml.Unmarshal(doc, &r)
	errL := yaml.Unmarshal(doc, &l)
	switch {
	case errL != nil && errR == nil:
		t.Fatalf("the API type accepts what the local type rejects: %v\n%s", errL, doc)
	case errR == nil && !reflect.DeepEqual(real(&r), local(&l)):
		t.Fatalf("decoded differently:\nAPI   %#v\nlocal %#v\n%s", real(&r), local(&l), doc)
	}
}

func compareAll(t *testing.T, doc []byte) {
	t.Helper()
	compare(t, doc, func(p *metav1.TypeMeta) any { return TypeMeta{Kind: p.Kind, APIVersion: p.APIVersion} },
		func(p *TypeMeta) any { return *p })
	compare(t, doc, func(p *corev1.Pod) any {
		return Pod{TypeMeta{p.Kind, p.APIVersion}, ObjectMeta{p.Name, p.Namespace}, project(p.Spec)}
	}, func(p *Pod) any { return *p })
	compare(t, doc, func(d *appsv1.DaemonSet) any {
		return DaemonSet{TypeMeta{d.Kind, d.APIVersion}, ObjectMeta{d.Name, d.Namespace}, DaemonSetSpec{PodTemplateSpec{project(d.Spec.Template.Spec)}}}
	}, func(d *DaemonSet) any { return *d })
	compare(t, doc, func(d *appsv1.Deployment) any {
		return Deployment{TypeMeta{d.Kind, d.APIVersion}, ObjectMeta{d.Name, d.Namespace}, DeploymentSpec{PodTemplateSpec{project(d.Spec.Template.Spec)}}}
	}, func(d *Deployment) any { return *d })
}

// seeds are the migrate golden inputs, split into documents, plus
// documents with wrong types in declared fields.
func seeds(t testing.TB) [][]byte {
	var out [][]byte
	for _, dir := range []string{"kubevip", "novaedge"} {
		paths, err := filepath.Glob(filepath.Join("..", "..", "..", "testdata", dir, "*.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			for _, doc := range strings.Split(string(b), "\n---") {
				out = append(out, []byte(doc))
			}
		}
	}
	for _, s := range []string{
		"kind: Pod\nspec: {containers: 3}\n",
		"kind: Pod\nmetadata: {name: [a]}\n",
		"kind: Pod\nspec: {containers: [{name: a, env: [{name: x, value: true}, {name: y, value: 1.5e1}, {name: z, value: null}]}]}\n",
		"kind: Pod\nspec: {containers: [{name: a, env: [{name: x, valueFrom: {configMapKeyRef: {name: [c], key: k}}}]}]}\n",
		"kind: Pod\nspec: {volumes: [{name: a, hostPath: {path: 7, type: File}}]}\n",
		"kind: DaemonSet\nspec: {template: {spec: {containers: [{name: a, args: [run, 1, true]}]}}}\n",
		"kind: Deployment\nspec: {replicas: 2, template: {metadata: {labels: {a: b}}, spec: {containers: [{name: a, envFrom: [{secretRef: {name: s}}, {configMapRef: {name: c}, prefix: P}]}]}}}\n",
	} {
		out = append(out, []byte(s))
	}
	return out
}

func TestDecodesLikeTheAPITypes(t *testing.T) {
	docs := seeds(t)
	if len(docs) < 10 {
		t.Fatalf("only %d seed documents: migrate's testdata is missing", len(docs))
	}
	for _, doc := range docs {
		compareAll(t, doc)
	}
}

// TestErrorsNameTheAPITypes checks an error in a declared field reads as it
// would with the API types: the same message, field path and type name.
func TestErrorsNameTheAPITypes(t *testing.T) {
	for _, doc := range []string{
		"kind: Pod\nspec: {containers: 3}\n",
		"kind: Pod\nspec: {containers: [{name: a, env: x}]}\n",
		"kind: Pod\nspec: {containers: [{name: a, env: [{name: x, valueFrom: {configMapKeyRef: {name: [c]}}}]}]}\n",
		"kind: Pod\nspec: {volumes: [{name: a, hostPath: x}]}\n",
		"kind: Pod\nmetadata: x\n",
		"kind: DaemonSet\nspec: {template: x}\n",
		"kind: Deployment\nspec: {template: {spec: x}}\n",
	} {
		var rp corev1.Pod
		var lp Pod
		var rd appsv1.DaemonSet
		var ld DaemonSet
		var rdep appsv1.Deployment
		var ldep Deployment
		for _, pair := range [][2]any{{&rp, &lp}, {&rd, &ld}, {&rdep, &ldep}} {
			errR := yaml.Unmarshal([]byte(doc), pair[0])
			errL := yaml.Unmarshal([]byte(doc), pair[1])
			if errR == nil {
				continue
			}
			if errL == nil || errL.Error() != errR.Error() {
				t.Errorf("%T of %q: error %v, want %v", pair[1], doc, errL, errR)
			}
		}
	}
}

func FuzzDecodesLikeTheAPITypes(f *testing.F) {
	for _, doc := range seeds(f) {
		f.Add(doc)
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if len(doc) > 64<<10 {
			return
		}
		compareAll(t, doc)
	})
}
