package ipam

import (
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
)

func TestParseRange(t *testing.T) {
	for _, tc := range []struct {
		in          string
		first, last string
		bad         string
	}{
		{in: "192.0.2.0/28", first: "192.0.2.0", last: "192.0.2.15"},
		{in: "192.0.2.5/28", first: "192.0.2.0", last: "192.0.2.15"},
		{in: "192.0.2.7/32", first: "192.0.2.7", last: "192.0.2.7"},
		{in: "10.0.0.0/8", first: "10.0.0.0", last: "10.255.255.255"},
		{in: "2001:db8::/120", first: "2001:db8::", last: "2001:db8::ff"},
		{in: "2001:db8::/64", first: "2001:db8::", last: "2001:db8::ffff:ffff:ffff:ffff"},
		{in: "::/0", first: "::", last: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
		{in: " 192.0.2.10 - 192.0.2.20 ", first: "192.0.2.10", last: "192.0.2.20"},
		{in: "192.0.2.9-192.0.2.9", first: "192.0.2.9", last: "192.0.2.9"},
		{in: "2001:db8::1-2001:db8::9", first: "2001:db8::1", last: "2001:db8::9"},
		{in: "192.0.2.20-192.0.2.10", bad: "starts after it ends"},
		{in: "192.0.2.1-2001:db8::1", bad: "mixes"},
		{in: "192.0.2.1", bad: "neither"},
		{in: "192.0.2.0/33", bad: "not a CIDR"},
		{in: "fe80::1%eth0-fe80::2", bad: "not a range"},
		{in: "a-b", bad: "not a range"},
	} {
		r, err := ParseRange(tc.in)
		if tc.bad != "" {
			if err == nil || !strings.Contains(err.Error(), tc.bad) {
				t.Errorf("ParseRange(%q) = %v, %v; want error containing %q", tc.in, r, err, tc.bad)
			}
			continue
		}
		if err != nil || r.First != netip.MustParseAddr(tc.first) || r.Last != netip.MustParseAddr(tc.last) {
			t.Errorf("ParseRange(%q) = %v, %v; want %s-%s", tc.in, r, err, tc.first, tc.last)
		}
	}
}

func TestParseRangesOverlap(t *testing.T) {
	for _, tc := range []struct {
		in  []string
		bad bool
	}{
		{[]string{"192.0.2.0/28", "192.0.2.16/28", "2001:db8::/120"}, false},
		{[]string{"192.0.2.0/28", "192.0.2.15-192.0.2.20"}, true},
		{[]string{"192.0.2.10-192.0.2.20", "192.0.2.0/24"}, true},
		{[]string{"192.0.2.0/24", "192.0.3.0/24", "192.0.2.200-192.0.2.201"}, true},
		{[]string{"2001:db8::/64", "2001:db8::5-2001:db8::6"}, true},
		{[]string{"0.0.0.0/8", "::/8"}, false}, // same bytes, other family
		{nil, true},
	} {
		_, err := ParseRanges(tc.in)
		if (err != nil) != tc.bad {
			t.Errorf("ParseRanges(%v) err = %v, want bad=%v", tc.in, err, tc.bad)
		}
	}
}

func TestSize(t *testing.T) {
	for _, tc := range []struct {
		in    []string
		buggy bool
		want  int64
	}{
		{[]string{"192.0.2.0/28"}, false, 16},
		{[]string{"192.0.2.0/28"}, true, 15},
		{[]string{"192.0.2.0/24"}, true, 254},
		{[]string{"192.0.2.0/23"}, true, 508},
		{[]string{"192.0.2.255-192.0.3.0"}, true, 0},
		{[]string{"192.0.2.254-192.0.3.1"}, true, 2},
		{[]string{"0.0.0.0/0"}, false, 1 << 32},
		{[]string{"0.0.0.0/0"}, true, 1<<32 - 2*(1<<24)},
		{[]string{"2001:db8::/120"}, true, 256},           // IPv6: nothing is buggy
		{[]string{"2001:db8::/65"}, false, math.MaxInt64}, // 2^63 saturates
		{[]string{"2001:db8::/66"}, false, 1 << 62},
		{[]string{"::/0", "192.0.2.0/24"}, false, math.MaxInt64},
		{[]string{"192.0.2.1-192.0.2.3", "2001:db8::1-2001:db8::2"}, false, 5},
	} {
		rs, err := ParseRanges(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		if got := rs.Size(tc.buggy); got != tc.want {
			t.Errorf("Size(%v, buggy=%v) = %d, want %d", tc.in, tc.buggy, got, tc.want)
		}
	}
	if AddSat(math.MaxInt64-1, 5) != math.MaxInt64 || AddSat(2, 3) != 5 {
		t.Error("AddSat does not saturate")
	}
}

func TestFirstFree(t *testing.T) {
	takenSet := func(addrs ...string) func(netip.Addr) bool {
		m := map[netip.Addr]bool{}
		for _, a := range addrs {
			m[netip.MustParseAddr(a)] = true
		}
		return func(a netip.Addr) bool { return m[a] }
	}
	for _, tc := range []struct {
		name  string
		in    []string
		fam   Family
		buggy bool
		taken []string
		want  string // "" none
	}{
		{"first", []string{"192.0.2.0/30"}, IPv4, false, nil, "192.0.2.0"},
		{"buggy-skips-.0", []string{"192.0.2.0/30"}, IPv4, true, nil, "192.0.2.1"},
		{"skip-taken", []string{"192.0.2.0/30"}, IPv4, false, []string{"192.0.2.0", "192.0.2.1"}, "192.0.2.2"},
		{"next-entry", []string{"192.0.2.0/31", "198.51.100.7/32"}, IPv4, false, []string{"192.0.2.0", "192.0.2.1"}, "198.51.100.7"},
		{"full", []string{"192.0.2.0/31"}, IPv4, false, []string{"192.0.2.0", "192.0.2.1"}, ""},
		{"buggy-range-full", []string{"192.0.2.255-192.0.3.0"}, IPv4, true, nil, ""},
		{"spec-order", []string{"192.0.2.100/32", "192.0.2.1/32"}, IPv4, false, nil, "192.0.2.100"},
		{"family-v6", []string{"192.0.2.0/24", "2001:db8::/64"}, IPv6, true, []string{"2001:db8::"}, "2001:db8::1"},
		{"family-missing", []string{"192.0.2.0/24"}, IPv6, false, nil, ""},
		{"huge-v6", []string{"::/0"}, IPv6, false, []string{"::", "::1"}, "::2"},
		{"end-of-space", []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127"}, IPv6, false,
			[]string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}, ""},
		{"end-of-v4", []string{"255.255.255.254/31"}, IPv4, false, []string{"255.255.255.254"}, "255.255.255.255"},
	} {
		rs, err := ParseRanges(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := rs.FirstFree(tc.fam, tc.buggy, takenSet(tc.taken...))
		if tc.want == "" {
			if ok {
				t.Errorf("%s: FirstFree = %s, want none", tc.name, got)
			}
			continue
		}
		if !ok || got != netip.MustParseAddr(tc.want) {
			t.Errorf("%s: FirstFree = %v %v, want %s", tc.name, got, ok, tc.want)
		}
	}
	// A million taken addresses in a /64 are skipped without materialising
	// the range: the cost is the taken set, not the pool.
	rs, _ := ParseRanges([]string{"2001:db8::/64"})
	start := time.Now()
	got, _ := rs.FirstFree(IPv6, false, func(a netip.Addr) bool { return a.As16()[13] < 0x10 })
	if got != netip.MustParseAddr("2001:db8::10:0") {
		t.Errorf("FirstFree over a /64 = %s", got)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("FirstFree over a /64 took %s", d)
	}
}

func pool(name string, created int, prio int32, autoAssign *bool, sa *v1alpha1.ServiceAllocation, addrs ...string) v1alpha1.IPPool {
	if sa != nil && prio != 0 {
		sa.Priority = prio
	}
	return v1alpha1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(time.Unix(int64(1000+created), 0))},
		Spec:       v1alpha1.IPPoolSpec{Addresses: addrs, AutoAssign: autoAssign, ServiceAllocation: sa},
	}
}

func TestBuildPoolsOverlapAndInvalid(t *testing.T) {
	pools := BuildPools([]v1alpha1.IPPool{
		pool("b-old", 0, 0, nil, nil, "192.0.2.0/28"),
		pool("a-new", 5, 0, nil, nil, "192.0.2.8-192.0.2.20"), // overlaps the older b-old
		pool("c", 6, 0, nil, nil, "192.0.2.30-192.0.2.20"),    // start > end
		pool("d", 7, 0, nil, nil, "192.0.2.16/28"),            // touches a-new only, which is invalid
		pool("e", 8, 0, nil, nil, "2001:db8::/64"),
	})
	want := map[string]string{"a-new": ReasonOverlap, "b-old": "", "c": ReasonBadAddresses, "d": "", "e": ""}
	for _, p := range pools {
		if p.Reason != want[p.Name] || (p.Err != nil) != (want[p.Name] != "") {
			t.Errorf("pool %s: reason %q err %v, want %q", p.Name, p.Reason, p.Err, want[p.Name])
		}
	}
	if p := PoolOf(pools, netip.MustParseAddr("192.0.2.9")); p == nil || p.Name != "b-old" {
		t.Errorf("PoolOf(192.0.2.9) = %v, want b-old", p)
	}
	if p := PoolOf(pools, netip.MustParseAddr("192.0.2.18")); p == nil || p.Name != "d" {
		t.Errorf("PoolOf(192.0.2.18) = %v, want d", p)
	}
	if p := PoolOf(pools, netip.MustParseAddr("198.51.100.1")); p != nil {
		t.Errorf("PoolOf(198.51.100.1) = %s, want none", p.Name)
	}
}

func TestMatchPools(t *testing.T) {
	no := false
	pools := BuildPools([]v1alpha1.IPPool{
		pool("all", 0, 0, nil, nil, "192.0.2.0/28"),
		pool("prod-only", 1, 10, nil, &v1alpha1.ServiceAllocation{Namespaces: []string{"prod"}}, "192.0.2.16/28"),
		pool("team-a", 2, 5, nil, &v1alpha1.ServiceAllocation{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}}, "192.0.2.32/28"),
		pool("web", 3, 5, nil, &v1alpha1.ServiceAllocation{
			ServiceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}, "192.0.2.48/28"),
		pool("manual", 4, 100, &no, nil, "192.0.2.64/28"),
		pool("broken", 5, 100, nil, nil, "192.0.2.90-192.0.2.80"),
		pool("neg", 6, -1, nil, &v1alpha1.ServiceAllocation{}, "192.0.2.96/28"),
		pool("badsel", 7, 0, nil, &v1alpha1.ServiceAllocation{
			ServiceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "x", Operator: "Bogus"}}}}, "192.0.2.112/28"),
	})
	names := func(ps []*Pool) string {
		var s []string
		for _, p := range ps {
			s = append(s, p.Name)
		}
		return strings.Join(s, ",")
	}
	for _, tc := range []struct {
		name string
		svc  ServiceFacts
		want string
	}{
		{"default", ServiceFacts{Namespace: "default"}, "all,neg"},
		{"prod", ServiceFacts{Namespace: "prod"}, "prod-only,all,neg"},
		{"team-a web", ServiceFacts{Namespace: "x", NamespaceLabels: map[string]string{"team": "a"}, Labels: map[string]string{"app": "web"}}, "team-a,web,all,neg"},
		{"named manual", ServiceFacts{Namespace: "default", PoolNames: []string{"manual"}}, "manual"},
		{"named restricted", ServiceFacts{Namespace: "default", PoolNames: []string{"prod-only", "all"}}, "all"},
		{"named broken", ServiceFacts{Namespace: "default", PoolNames: []string{"broken"}}, ""},
		{"named unknown", ServiceFacts{Namespace: "default", PoolNames: []string{"nope"}}, ""},
	} {
		if got := names(MatchPools(pools, tc.svc)); got != tc.want {
			t.Errorf("%s: MatchPools = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestCanShare(t *testing.T) {
	web := Sharer{Key: "k", Ports: []Port{{"TCP", 80}, {"TCP", 443}}}
	for _, tc := range []struct {
		name    string
		s       Sharer
		holders []Sharer
		bad     string
	}{
		{"disjoint", Sharer{Key: "k", Ports: []Port{{"TCP", 8080}}}, []Sharer{web}, ""},
		{"same port other protocol", Sharer{Key: "k", Ports: []Port{{"UDP", 443}}}, []Sharer{web}, ""},
		{"port clash", Sharer{Key: "k", Ports: []Port{{"TCP", 443}}}, []Sharer{web}, "443/TCP"},
		{"other key", Sharer{Key: "j", Ports: []Port{{"TCP", 8080}}}, []Sharer{web}, "another key"},
		{"holder without key", Sharer{Key: "k"}, []Sharer{{Ports: []Port{{"TCP", 1}}}}, "without a sharing key"},
		{"no key", Sharer{Ports: []Port{{"TCP", 8080}}}, []Sharer{web}, "no sharing key"},
		{"clash with second holder", Sharer{Key: "k", Ports: []Port{{"UDP", 53}}}, []Sharer{web, {Key: "k", Ports: []Port{{"udp", 53}}}}, "53/UDP"},
	} {
		err := CanShare(tc.s, tc.holders)
		if (tc.bad == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.bad)) {
			t.Errorf("%s: CanShare = %v, want %q", tc.name, err, tc.bad)
		}
	}
}
