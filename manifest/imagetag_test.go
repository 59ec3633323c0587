package manifest

import (
	"regexp"
	"strings"
	"testing"
)

func TestImageTag(t *testing.T) {
	// The grammar of a tag in the OCI distribution spec.
	valid := regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$`)
	for _, tc := range []struct{ version, want string }{
		{"", "latest"},
		{"dev", "latest"},
		{"1.2.3", "1.2.3"},
		{"1.2.3+git4.abc1234", "1.2.3-git4.abc1234"},
		{"1.3.0~rc1", "1.3.0-rc1"},
		{"0.0.0~git148.a79c8b6.dirty", "0.0.0-git148.a79c8b6.dirty"},
		{"v1.2.3-4-gabc1234", "v1.2.3-4-gabc1234"},
		{strings.Repeat("1", 200), strings.Repeat("1", 128)},
	} {
		got := ImageTag(tc.version)
		if got != tc.want {
			t.Errorf("ImageTag(%q) = %q, want %q", tc.version, got, tc.want)
		}
		if !valid.MatchString(got) {
			t.Errorf("ImageTag(%q) = %q is not a valid tag", tc.version, got)
		}
	}
	pod, err := StaticPod([]Var{{Name: "VIPD_ADDRESS", Value: "10.0.0.100/32"}}, PodOptions{Version: "1.2.3+git4.abc1234"})
	if err != nil {
		t.Fatal(err)
	}
	if img := pod.Spec.Containers[0].Image; img != "ghcr.io/vipd/vipd:1.2.3-git4.abc1234" {
		t.Errorf("static pod image %q", img)
	}
}
