package kube

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/fakedo"
)

// TestFLIPOPNodeDNSCases ports FLIPOP's NodeDNSRecordSet cases
// (pkg/nodedns/controller_test.go) that users see in status and metrics:
// a write error is "in-progress" with "Failed to update DNS: ..."; an update
// to an unknown provider is "error" with `unknown provider "unknown"` and
// the records series keeps its value; a bad selector reads "Error parsing
// node selector: ..." once.
func TestFLIPOPNodeDNSCases(t *testing.T) {
	h := newHarness(t)
	t.Parallel() // after the serial setup in newHarness
	h.node("melbourne", 901, "10.0.0.1")
	mk := func(name string, edit func(spec map[string]any)) {
		u := h.example("nodednsrecordset.yaml", func(spec map[string]any) {
			m := spec["match"].(map[string]any)
			delete(m, "podNamespace")
			delete(m, "podLabel")
			delete(spec, "provider")
			spec["dnsRecordSet"] = map[string]any{"provider": "digitalocean", "zone": "example.com", "recordName": name, "ttl": int64(120)}
			if edit != nil {
				edit(spec)
			}
		})
		u.SetName(name)
		h.apply(u)
	}
	// Writes of "failing" keep failing until the fault is cleared.
	h.do.AddFault(fakedo.Fault{Method: "POST", Path: "/v2/domains/example.com/records", Status: 500, Count: -1})
	mk("failing", nil)
	mk("bad-selector", func(spec map[string]any) { spec["match"].(map[string]any)["nodeLabel"] = "#invalid#" })
	ctl := h.start("one", ControllerNodeDNSRecordSet)
	eventually(t, 20*time.Second, "write error and selector error", func() error {
		if s := h.recordSet("failing").Status; s.State != DNSStateInProgress || !strings.HasPrefix(s.Error, "Failed to update DNS: ") {
			return fmt.Errorf("failing status %+v", s)
		}
		s := h.recordSet("bad-selector").Status
		if s.State != DNSStateError || !strings.HasPrefix(s.Error, "Error parsing node selector: unable to parse requirement") {
			return fmt.Errorf("bad-selector status %+v", s)
		}
		return nil
	})
	if _, err := metricValue(ctl.reg, "flipop_nodednsrecordset_records", map[string]string{"name": "failing"}); err != nil {
		t.Errorf("records series of a failing set: %v", err)
	}
	h.do.ClearFaults()
	eventually(t, 20*time.Second, "retried and written", func() error {
		if s := h.recordSet("failing").Status; s != (NodeDNSRecordSetStatus{State: DNSStateActive}) {
			return fmt.Errorf("status %+v", s)
		}
		if got := h.doRecords("failing"); !slices.Equal(got, []string{"10.0.0.1/120"}) {
			return fmt.Errorf("records %v", got)
		}
		v, err := metricValue(ctl.reg, "flipop_nodednsrecordset_records", map[string]string{"name": "failing", "provider": "digitalocean", "dns": "failing.example.com"})
		if err != nil || v != 1 {
			return fmt.Errorf("records metric %v (%v)", v, err)
		}
		return nil
	})
	// Invalid update: FLIPOP's texts, and the series stays at 1.
	mk("failing", func(spec map[string]any) { spec["dnsRecordSet"].(map[string]any)["provider"] = "unknown" })
	eventually(t, 20*time.Second, "invalid update", func() error {
		if s := h.recordSet("failing").Status; s != (NodeDNSRecordSetStatus{State: DNSStateError, Error: `unknown provider "unknown"`}) {
			return fmt.Errorf("status %+v", s)
		}
		return nil
	})
	never(t, 2*time.Second, "records series kept", func() error {
		v, err := metricValue(ctl.reg, "flipop_nodednsrecordset_records", map[string]string{"name": "failing", "provider": "digitalocean"})
		if err != nil || v != 1 {
			return fmt.Errorf("records metric %v (%v), want FLIPOP's last value 1", v, err)
		}
		return nil
	})
}
