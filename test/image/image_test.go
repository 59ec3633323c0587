// Package image tests vipd's container image the way a kubelet would run
// it: `make image`'s builder (packaging/image.sh) writes the OCI archive
// twice from this tree (the bytes must match), the archive is unpacked into
// an OCI runtime bundle, and runc runs it in a lab network namespace with
// exactly the command, arguments, environment, capabilities, user, mounts
// and read-only root that `vipd manifest static-pod` (the image's own vipd)
// generates. The VIP must be reachable from another namespace, /healthz
// must answer, and a stop must release the VIP.
package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
	"github.com/vipd/vipd/manifest"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "packaging", "image.sh")); err != nil {
		t.Fatalf("repository root not found at %s: %v", dir, err)
	}
	return dir
}

// buildImage runs packaging/image.sh into a fresh directory and returns
// the archive.
func buildImage(ctx context.Context, t *testing.T, repo, describe string) string {
	t.Helper()
	dist := t.TempDir()
	cmd := exec.CommandContext(ctx, filepath.Join(repo, "packaging", "image.sh"), describe)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "DIST="+dist, "ARCH=amd64")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("packaging/image.sh: %v\n%s", err, out)
	}
	archives, _ := filepath.Glob(filepath.Join(dist, "vipd-image-*.oci.tar"))
	if len(archives) != 1 {
		t.Fatalf("image.sh wrote %v, want one archive\n%s", archives, out)
	}
	t.Logf("image built in %v: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(out)))
	return archives[0]
}

// ociArchive is an unpacked view of the archive's files.
type ociArchive map[string][]byte

func readArchive(t *testing.T, file string) ociArchive {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a := ociArchive{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return a
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		a[h.Name] = b
	}
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
}

type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Created      string `json:"created"`
	Config       struct {
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		Env        []string          `json:"Env"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
}

// image is what the test needs from the archive: the tags, the manifest
// digest, the config and the root filesystem's entries.
type image struct {
	tags   []string
	digest string
	config imageConfig
	layer  []byte // uncompressed tar
}

func (a ociArchive) blob(t *testing.T, d descriptor) []byte {
	t.Helper()
	b, ok := a["blobs/"+strings.Replace(d.Digest, ":", "/", 1)]
	if !ok || int64(len(b)) != d.Size {
		t.Fatalf("blob %s missing or of the wrong size", d.Digest)
	}
	return b
}

func (a ociArchive) image(t *testing.T) image {
	t.Helper()
	var lay struct {
		Version string `json:"imageLayoutVersion"`
	}
	if err := json.Unmarshal(a["oci-layout"], &lay); err != nil || lay.Version != "1.0.0" {
		t.Errorf("oci-layout = %q (%v)", a["oci-layout"], err)
	}
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(a["index.json"], &index); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	var img image
	for _, m := range index.Manifests {
		if m.MediaType != "application/vnd.oci.image.manifest.v1+json" {
			t.Errorf("manifest media type %s", m.MediaType)
		}
		if img.digest != "" && m.Digest != img.digest {
			t.Errorf("two different images in one archive: %s and %s", img.digest, m.Digest)
		}
		img.digest = m.Digest
		name := m.Annotations["org.opencontainers.image.ref.name"]
		if name == "" || m.Annotations["io.containerd.image.name"] != name {
			t.Errorf("manifest annotations %v: want the same name for ctr and podman", m.Annotations)
		}
		img.tags = append(img.tags, name)
	}
	if len(index.Manifests) == 0 {
		t.Fatal("index.json lists no image")
	}
	var man struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	if err := json.Unmarshal(a.blob(t, index.Manifests[0]), &man); err != nil {
		t.Fatal(err)
	}
	if len(man.Layers) != 1 || man.Layers[0].MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
		t.Fatalf("layers %+v, want one gzip layer", man.Layers)
	}
	if err := json.Unmarshal(a.blob(t, man.Config), &img.config); err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(a.blob(t, man.Layers[0])))
	if err != nil {
		t.Fatal(err)
	}
	if img.layer, err = io.ReadAll(zr); err != nil {
		t.Fatal(err)
	}
	return img
}

// unpack writes the layer into dir and returns its entries as "mode uid:gid
// path".
func unpack(t *testing.T, layer []byte, dir string) []string {
	t.Helper()
	var entries []string
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := path.Clean("/" + h.Name)
		entries = append(entries, fmt.Sprintf("%v %d:%d %s", os.FileMode(h.Mode).Perm(), h.Uid, h.Gid, name))
		dst := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, os.FileMode(h.Mode).Perm()); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, b, os.FileMode(h.Mode).Perm()); err != nil {
				t.Fatal(err)
			}
		default:
			t.Errorf("unexpected entry type %c for %s", h.Typeflag, name)
		}
	}
	return entries
}

func TestImage(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.Short(t)
	testenv.RequireCommands(t, "runc", "ip", "go", "git")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	repo := repoRoot(t)

	// Same commit, two builds: same bytes.
	first := buildImage(ctx, t, repo, "v1.2.3-4-gabc1234")
	second := buildImage(ctx, t, repo, "v1.2.3-4-gabc1234")
	b1, _ := os.ReadFile(first)
	b2, _ := os.ReadFile(second)
	if !bytes.Equal(b1, b2) {
		t.Errorf("two builds of the same tree differ: %s and %s", first, second)
	}
	img := readArchive(t, first).image(t)
	t.Logf("image %s, tags %v", img.digest, img.tags)
	wantTag := "ghcr.io/vipd/vipd:" + manifest.ImageTag("1.2.3+git4.abc1234")
	sort.Strings(img.tags)
	if strings.Join(img.tags, ",") != "ghcr.io/vipd/vipd:1.2.3-git4.abc1234,ghcr.io/vipd/vipd:latest" {
		t.Errorf("tags %v, want %s and :latest", img.tags, wantTag)
	}
	c := img.config
	if c.OS != "linux" || c.Architecture != "amd64" || strings.Join(c.Config.Entrypoint, " ") != "/usr/bin/vipd" ||
		strings.Join(c.Config.Cmd, " ") != "run" || c.Config.Labels["org.opencontainers.image.licenses"] != "Apache-2.0" ||
		c.Config.Labels["org.opencontainers.image.version"] != "1.2.3+git4.abc1234" {
		t.Errorf("image config %+v", c)
	}

	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	entries := unpack(t, img.layer, rootfs)
	// vipd, vipd-controllers, the CA certificates and the directories that
	// hold them (and the state volume's mount point), nothing else.
	want := []string{
		"-rwxr-xr-x 0:0 /etc", "-rwxr-xr-x 0:0 /etc/ssl", "-rwxr-xr-x 0:0 /etc/ssl/certs",
		"-rwxr-xr-x 0:0 /usr", "-rwxr-xr-x 0:0 /usr/bin", "-rwxr-xr-x 0:0 /usr/lib", "-rwxr-xr-x 0:0 /usr/lib/vipd",
		"-rwxr-xr-x 0:0 /var", "-rwxr-xr-x 0:0 /var/lib", "-rwxr-x--- 0:0 /var/lib/vipd",
		"-rw-r--r-- 0:0 /etc/ssl/certs/ca-certificates.crt", "-rwxr-xr-x 0:0 /usr/bin/vipd",
		"-rwxr-xr-x 0:0 /usr/lib/vipd/vipd-controllers",
	}
	if strings.Join(entries, "\n") != strings.Join(want, "\n") {
		t.Errorf("image files:\n%s\nwant:\n%s", strings.Join(entries, "\n"), strings.Join(want, "\n"))
	}
	pemData, _ := os.ReadFile(filepath.Join(rootfs, "etc/ssl/certs/ca-certificates.crt"))
	if n := bytes.Count(pemData, []byte("BEGIN CERTIFICATE")); n < 100 {
		t.Errorf("%d CA certificates in the image", n)
	}
	vipd := filepath.Join(rootfs, "usr/bin/vipd")
	out, err := exec.CommandContext(ctx, vipd, "version").CombinedOutput()
	if err != nil || !regexp.MustCompile(`^vipd 1\.2\.3\+git4\.abc1234\ncommit: [0-9a-f]{40}\ngo: go1\.`).Match(out) {
		t.Errorf("vipd version in the image: %v\n%s", err, out)
	}

	t.Run("run", func(t *testing.T) { runImage(ctx, t, bundle, vipd, img, wantTag) })
}

// runImage runs the unpacked image with runc in a lab node namespace as
// the static pod would run it.
func runImage(ctx context.Context, t *testing.T, bundle, vipd string, img image, wantImage string) {
	l := lab.New(t, lab.Options{Nodes: 1, Client: true})
	node := l.Nodes[0]
	vip := l.VIP4(70)
	if _, err := node.StartAPIServer("0.0.0.0:6443", lab.OK); err != nil {
		t.Fatal(err)
	}

	// The static pod the image's own vipd generates.
	gen := exec.CommandContext(ctx, vipd, "manifest", "static-pod")
	gen.Env = []string{"VIPD_ADDRESS=" + vip.String() + "/32", "VIPD_INTERFACE=" + node.Link, "VIPD_HEALTH_INTERVAL=200ms"}
	podYAML, err := gen.Output()
	if err != nil {
		t.Fatalf("vipd manifest static-pod: %v", err)
	}
	var pod manifest.Pod
	if err := yaml.UnmarshalStrict(podYAML, &pod); err != nil {
		t.Fatalf("static pod: %v\n%s", err, podYAML)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("static pod has %d containers", len(pod.Spec.Containers))
	}
	ctr := pod.Spec.Containers[0]
	if ctr.Image != wantImage {
		t.Errorf("static pod names image %s; make image tagged it %v", ctr.Image, img.tags)
	}
	hostPaths := map[string]string{} // a hostPath of the pod -> a directory of the test
	for _, v := range pod.Spec.Volumes {
		hostPaths[v.Name] = t.TempDir()
		t.Logf("volume %s: hostPath %s is %s here", v.Name, v.HostPath.Path, hostPaths[v.Name])
	}
	spec, err := runtimeSpec(pod, img.config, map[string]string{"spec.nodeName": node.Name}, hostPaths)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.MarshalIndent(spec, "", "  ")
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), js, 0o600); err != nil {
		t.Fatal(err)
	}
	if testing.Verbose() {
		t.Logf("static pod:\n%s\nOCI process: %s", podYAML, mustJSON(spec["process"]))
	}

	runcRoot := t.TempDir()
	id := "vipd-image-" + l.ID
	runc := func(args ...string) ([]byte, error) {
		return exec.CommandContext(ctx, "runc", append([]string{"--root", runcRoot}, args...)...).CombinedOutput()
	}
	mon, err := l.Monitor(vip)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// hostNetwork: the container has no network namespace of its own; runc
	// runs in the node's. nsenter enters only the network namespace (ip
	// netns exec would also remount /sys, hiding the cgroup mounts runc
	// needs).
	var output testenv.Buffer
	cmd := exec.Command("nsenter", "--net=/run/netns/"+node.NS, "runc", "--root", runcRoot, "run", "--bundle", bundle, id)
	cmd.Stdout, cmd.Stderr = &output, &output
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// From the lab's spawner thread: Pdeathsig follows the thread that
	// forked, and the lab's namespace helpers end threads (CI: runc was
	// SIGKILLed 23 ms after the stop began, the VIP left bound).
	if err := l.StartCommand(cmd); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_, _ = runc("kill", id, "KILL")
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
		}
		_, _ = runc("delete", "--force", id)
		if t.Failed() {
			t.Logf("container output:\n%s", output.String())
		}
	})
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	go func() {
		select {
		case err := <-exited:
			exited <- err // for the stop below and the cleanup
			wcancel()
		case <-wctx.Done():
		}
	}()
	holder, err := mon.WaitStable(wctx, 500*time.Millisecond)
	if err != nil || holder != node.Name {
		t.Fatalf("VIP holder %q (%v), want %s", holder, err, node.Name)
	}
	t.Logf("container started; VIP held after %v", time.Since(start).Round(time.Millisecond))
	// From the client namespace: ARP resolves the VIP to the node, and the
	// node's apiserver answers through it.
	answer, err := l.Client.Probe(ctx, vip.String()+":6443", 2*time.Second)
	if err != nil || answer != node.Name {
		t.Errorf("client probe of %s: %q, %v", vip, answer, err)
	}
	if neigh, err := l.Client.Neigh(ctx, vip); err != nil || !strings.Contains(strings.ToLower(neigh), strings.ToLower(node.MAC.String())) {
		t.Errorf("client neighbour entry for %s = %q (%v), want the node's MAC %s", vip, neigh, err, node.MAC)
	}
	code, body := httpGet(t, node, "http://127.0.0.1:9469/healthz")
	if code != http.StatusOK || strings.TrimSpace(body) != "ok" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	_, metrics := httpGet(t, node, "http://127.0.0.1:9469/metrics")
	if !strings.Contains(metrics, `vipd_vip_held{mode="l2",vip="`+vip.String()+`/32"} 1`) {
		t.Errorf("/metrics does not show the VIP held:\n%s", grepLines(metrics, "vipd_vip_held"))
	}

	// The container's process has exactly the pod's capabilities, no new
	// privileges and a read-only root.
	state, err := runc("state", id)
	if err != nil {
		t.Fatalf("runc state: %v\n%s", err, state)
	}
	var st struct {
		Pid int `json:"pid"`
	}
	_ = json.Unmarshal(state, &st)
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", st.Pid))
	for _, f := range []string{"CapEff", "CapPrm", "CapBnd"} {
		// NET_BIND_SERVICE (10), NET_ADMIN (12), NET_RAW (13).
		if !regexp.MustCompile(`(?m)^` + f + `:\s+0000000000003400$`).Match(status) {
			t.Errorf("%s of the container's vipd is not NET_BIND_SERVICE|NET_ADMIN|NET_RAW:\n%s", f, grepLines(string(status), "Cap"))
		}
	}
	if !regexp.MustCompile(`(?m)^NoNewPrivs:\s+1$`).Match(status) {
		t.Error("NoNewPrivs is not set (allowPrivilegeEscalation: false)")
	}
	mounts, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", st.Pid))
	if !regexp.MustCompile(`(?m)^\S+ \S+ \S+ \S+ / ro[, ]`).Match(mounts) {
		t.Errorf("the container's root is not read-only:\n%s", mounts)
	}
	if !regexp.MustCompile(`(?m)^\S+ \S+ \S+ \S+ /var/lib/vipd rw[, ]`).Match(mounts) {
		t.Errorf("the state volume is not mounted read-write at /var/lib/vipd:\n%s", mounts)
	}

	// Stop as the kubelet does: SIGTERM, SIGKILL after the grace period.
	grace := 30 * time.Second
	if s := pod.Spec.TerminationGracePeriodSeconds; s != nil {
		grace = time.Duration(*s) * time.Second
	}
	stopAt := time.Now()
	if out, err := runc("kill", id, "TERM"); err != nil {
		t.Fatalf("runc kill: %v\n%s", err, out)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Errorf("container exit: %v", err)
		}
	case <-time.After(grace):
		t.Errorf("container did not stop within the grace period %v", grace)
	}
	t.Logf("container stopped %v after SIGTERM", time.Since(stopAt).Round(time.Millisecond))
	if has, err := node.HasAddr(ctx, vip); err != nil || has {
		t.Errorf("VIP still bound after the container stopped (%v)", err)
	}
	if testing.Verbose() {
		t.Logf("container output:\n%s", output.String())
	}
	if _, err := l.Client.Probe(ctx, vip.String()+":6443", 500*time.Millisecond); err == nil {
		t.Error("the VIP still answers after the container stopped")
	}
}

// runtimeSpec turns the static pod's container into an OCI runtime
// configuration the way a CRI runtime does: the image's entrypoint with the
// pod's args, the image's env then the pod's, the pod's capabilities (drop
// ALL, add ...), user, no_new_privs, read-only root and hostPath mounts,
// no network namespace (hostNetwork).
func runtimeSpec(pod manifest.Pod, cfg imageConfig, fields, hostPaths map[string]string) (map[string]any, error) {
	c := pod.Spec.Containers[0]
	if !pod.Spec.HostNetwork {
		return nil, fmt.Errorf("the static pod does not use the host network")
	}
	args := append([]string{}, cfg.Config.Entrypoint...)
	if len(c.Args) > 0 {
		args = append(args, c.Args...)
	} else {
		args = append(args, cfg.Config.Cmd...)
	}
	env := append([]string{}, cfg.Config.Env...)
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			f, ok := fields[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				return nil, fmt.Errorf("env %s: field %s unknown to the test", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			v = f
		}
		env = append(env, e.Name+"="+v)
	}
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil || sc.RunAsUser == nil {
		return nil, fmt.Errorf("the static pod has no capabilities or user: %+v", sc)
	}
	var caps []string
	if len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		return nil, fmt.Errorf("the static pod drops %v, the test expects ALL", sc.Capabilities.Drop)
	}
	for _, a := range sc.Capabilities.Add {
		caps = append(caps, "CAP_"+string(a))
	}
	mounts := []map[string]any{
		{"destination": "/proc", "type": "proc", "source": "proc"},
		{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": []string{"nosuid", "noexec", "nodev"}},
		{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
	}
	for _, m := range c.VolumeMounts {
		src, ok := hostPaths[m.Name]
		if !ok {
			return nil, fmt.Errorf("volume mount %s has no volume", m.Name)
		}
		opts := []string{"rbind", "rprivate"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		} else {
			opts = append(opts, "rw")
		}
		mounts = append(mounts, map[string]any{"destination": m.MountPath, "type": "bind", "source": src, "options": opts})
	}
	readOnly := sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
	noNewPrivs := sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation
	return map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"terminal": false,
			"user":     map[string]any{"uid": *sc.RunAsUser, "gid": 0},
			"args":     args,
			"env":      env,
			"cwd":      "/",
			"capabilities": map[string]any{
				"bounding": caps, "effective": caps, "permitted": caps,
			},
			"noNewPrivileges": noNewPrivs,
		},
		"root":     map[string]any{"path": "rootfs", "readonly": readOnly},
		"hostname": pod.Metadata.Name,
		"mounts":   mounts,
		"linux": map[string]any{
			// No "network" namespace: the pod uses the host's (the lab node's).
			"namespaces": []map[string]string{{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}},
			"maskedPaths": []string{"/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
				"/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"},
			"readonlyPaths": []string{"/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}, nil
}

// httpGet fetches url with curl inside the host's namespace.
func httpGet(t *testing.T, h *lab.Host, url string) (int, string) {
	t.Helper()
	out, err := h.Output(context.Background(), "curl", "-sS", "-m", "3", "-w", "\n%{http_code}", url)
	if err != nil {
		t.Errorf("GET %s in %s: %v", url, h.NS, err)
		return 0, ""
	}
	s := string(out)
	i := strings.LastIndexByte(s, '\n')
	code, _ := strconv.Atoi(s[i+1:])
	return code, s[:i]
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
