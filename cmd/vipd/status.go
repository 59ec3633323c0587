package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/vipd/vipd/cluster"
	"github.com/vipd/vipd/health"
	"github.com/vipd/vipd/internal/wire"
	"github.com/vipd/vipd/vip"
)

// Status is the JSON document served on /status.
type Status struct {
	Node       string         `json:"node"`
	Version    string         `json:"version"`
	Mode       string         `json:"mode"`
	Interface  string         `json:"interface,omitempty"`
	Started    time.Time      `json:"started"`
	Health     *HealthStatus  `json:"health,omitempty"`
	VIPs       []VIPStatus    `json:"vips"`
	Components map[string]any `json:"components,omitempty"`
}

// HealthStatus is the apiserver health section of /status.
type HealthStatus struct {
	URL         string    `json:"url"`
	Healthy     bool      `json:"healthy"`
	Reason      string    `json:"reason"`
	Code        int       `json:"code,omitempty"`
	Error       string    `json:"error,omitempty"`
	Checked     time.Time `json:"checked"`
	Since       time.Time `json:"since"`
	Consecutive int       `json:"consecutive"`
	// Credential is what the probe authenticates with, and since when.
	Credential *CredentialStatus `json:"credential,omitempty"`
	// ReadyzURL is probed for the apiserver's graceful shutdown ("" when
	// off); Readyz is what it said last: serving, shutdown or unknown.
	ReadyzURL string `json:"readyz_url,omitempty"`
	Readyz    string `json:"readyz,omitempty"`
	// Drain is set while the apiserver is going away: this node hands
	// its VIPs over and is not eligible until it is back.
	Drain *DrainStatus `json:"drain,omitempty"`
}

// DrainStatus is a drain under way (health.Drain).
type DrainStatus struct {
	Reason   string    `json:"reason"` // apiserver_shutdown or apiserver_refused
	Since    time.Time `json:"since"`
	Eligible bool      `json:"eligible"` // false once the VIPs were handed over
}

// CredentialStatus names the probe's credential (never its secret).
type CredentialStatus struct {
	Kind     string     `json:"kind"` // none, client-certificate or token
	Path     string     `json:"path,omitempty"`
	Subject  string     `json:"subject,omitempty"`
	NotAfter *time.Time `json:"not_after,omitempty"`
	Since    time.Time  `json:"since"`
	// Loaded: a credential was loaded since start, so 401/403 are failures.
	Loaded bool   `json:"loaded"`
	CAFile string `json:"ca_file,omitempty"` // "" while the server certificate is not verified
}

// VIPStatus is one VIP in /status.
type VIPStatus struct {
	VIP            string      `json:"vip"`
	Held           bool        `json:"held"`
	Elected        *bool       `json:"elected,omitempty"`
	ElectionReason string      `json:"election_reason,omitempty"`
	LastTransition *Transition `json:"last_transition,omitempty"`
	// LastFailover is the timeline of the last failover or planned
	// handover that made this node the holder.
	LastFailover *vip.Timeline `json:"last_failover,omitempty"`
}

// Transition is the last change of a VIP's holding state.
type Transition struct {
	Held  bool      `json:"held"`
	At    time.Time `json:"at"`
	Cause string    `json:"cause"`
}

func (d *daemon) statusDoc() Status {
	s := Status{Node: d.cfg.NodeName, Version: version, Mode: d.cfg.Mode, Interface: d.iface, Started: d.started, VIPs: []VIPStatus{}}
	if d.checker != nil {
		h := d.checker.Status()
		s.Health = &HealthStatus{URL: d.cfg.HealthURL, Healthy: h.Healthy, Reason: h.Reason, Code: h.Code, Error: h.Error,
			Checked: h.Checked, Since: h.Since, Consecutive: h.Consecutive}
		s.Health.Credential = credentialStatus(h.Credential)
		if d.cfg.HealthReadyzURL != "" {
			s.Health.ReadyzURL, s.Health.Readyz = d.cfg.HealthReadyzURL, h.Readyz
		}
		if h.Draining {
			s.Health.Drain = &DrainStatus{Reason: h.DrainReason, Since: h.DrainSince, Eligible: h.Eligible}
		}
	}
	if d.driver != nil {
		for _, v := range d.driver.State() {
			vs := VIPStatus{VIP: v.VIP.String(), Held: v.Held}
			if d.elector != nil {
				e := v.Elected
				vs.Elected, vs.ElectionReason = &e, v.ElectionReason
			}
			if !v.Last.At.IsZero() {
				vs.LastTransition = &Transition{Held: v.Last.Held, At: v.Last.At, Cause: v.Last.Cause}
			}
			if !v.LastFailover.DecidedAt.IsZero() {
				tl := v.LastFailover
				vs.LastFailover = &tl
			}
			s.VIPs = append(s.VIPs, vs)
		}
	}
	if d.elector != nil || len(d.extra) > 0 {
		s.Components = map[string]any{}
		if d.elector != nil {
			s.Components["cluster"] = d.elector.Status()
		}
		for name, fn := range d.extra {
			s.Components[name] = fn()
		}
	}
	return s
}

// statusServer serves /metrics, /status, /healthz and the egress
// gateways the egressfeed child asks for.
type statusServer struct{ *httpServer }

func startStatusServer(addr string, d *daemon) (*statusServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("VIPD_METRICS_ADDRESS %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	var g prometheus.Gatherer = d.reg
	if d.ctrl != nil {
		g = prometheus.Gatherers{d.reg, d.ctrl}
	}
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(d.statusDoc())
	})
	// What the egressfeed child needs from the daemon (internal/wire).
	mux.Handle(wire.EgressGatewaysPath, wire.EgressGatewaysHandler(d.egressGateways))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		// The daemon is healthy when its loops run: the driver answers and
		// the health checker has probed recently. The apiserver's own health
		// is reported in /status, not here: an unhealthy apiserver is a
		// normal state for vipd.
		if d.checker != nil {
			st := d.checker.Status()
			limit := 3*d.cfg.HealthInterval + d.cfg.HealthTimeout + 2*time.Second
			if st.Checked.IsZero() && time.Since(d.started) > limit || !st.Checked.IsZero() && time.Since(st.Checked) > limit {
				http.Error(w, "health checker stalled: last probe "+st.Checked.Format(time.RFC3339), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
	return &statusServer{serveHTTP(ln, mux)}, nil
}

func newStatusCmd() *cobra.Command {
	var addr string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "show the running daemon's VIPs, health and cluster as a table",
		Long: `status asks the running vipd (its /status endpoint on VIPD_METRICS_ADDRESS)
and prints which VIPs this node holds, why, the apiserver health and, in
cluster modes, the members and who holds what.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if addr == "" {
				addr = os.Getenv("VIPD_METRICS_ADDRESS")
			}
			if addr == "" {
				addr = "127.0.0.1:9469"
			}
			client := &http.Client{Timeout: 3 * time.Second}
			resp, err := client.Get("http://" + addr + "/status")
			if err != nil {
				return fmt.Errorf("is vipd running? %w", err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				return err
			}
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s/status: %s", addr, resp.Status)
			}
			if asJSON {
				_, err = cmd.OutOrStdout().Write(body)
				return err
			}
			var s Status
			if err := json.Unmarshal(body, &s); err != nil {
				return fmt.Errorf("decode /status: %w", err)
			}
			return printStatus(cmd.OutOrStdout(), s, time.Now())
		},
	}
	cmd.Flags().StringVar(&addr, "address", "", "address of the daemon's metrics/status listener [env VIPD_METRICS_ADDRESS, default 127.0.0.1:9469]")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the raw JSON")
	return cmd
}

func printStatus(w io.Writer, s Status, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "node:\t%s (vipd %s, mode %s", s.Node, s.Version, s.Mode)
	if s.Interface != "" {
		fmt.Fprintf(tw, ", interface %s", s.Interface)
	}
	fmt.Fprintf(tw, ", up %s)\n", ago(now, s.Started))
	if h := s.Health; h != nil {
		state := "unhealthy"
		if h.Healthy {
			state = "healthy"
		}
		fmt.Fprintf(tw, "apiserver:\t%s since %s (last probe %s: %s", state, ago(now, h.Since), ago(now, h.Checked), h.Reason)
		if h.Error != "" {
			fmt.Fprintf(tw, ", %s", h.Error)
		}
		fmt.Fprintf(tw, ")\n")
		if dr := h.Drain; dr != nil {
			what := "handing the VIPs over"
			if !dr.Eligible {
				what = "handed over, not eligible until the apiserver is back"
			}
			fmt.Fprintf(tw, "drain:\t%s since %s (%s)\n", dr.Reason, ago(now, dr.Since), what)
		}
		if c := h.Credential; c != nil {
			fmt.Fprintf(tw, "credential:\t%s\n", describeCredential(c, now))
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "VIP\tHELD\tSINCE\tWHY")
	for _, v := range s.VIPs {
		held, since, why := "no", "-", ""
		if v.Held {
			held = "yes"
		}
		if t := v.LastTransition; t != nil {
			since, why = ago(now, t.At), t.Cause
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", v.VIP, held, since, why)
	}
	for _, v := range s.VIPs {
		if t := v.LastFailover; t != nil {
			fmt.Fprintf(tw, "last %s to this node:\t%s\n", t.Kind(), describeTimeline(*t, now))
		}
	}
	names := make([]string, 0, len(s.Components))
	for n := range s.Components {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if n == "cluster" {
			if err := printCluster(tw, s.Components[n], now); err == nil {
				continue
			}
		}
		if n == "pools" {
			if err := printPools(tw, s.Components[n]); err == nil {
				continue
			}
		}
		b, err := json.MarshalIndent(s.Components[n], "  ", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "\n%s:\n  %s\n", n, strings.TrimSpace(string(b)))
	}
	return tw.Flush()
}

func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t).Round(100 * time.Millisecond)
	if d < 0 {
		d = 0
	}
	return d.String() + " ago"
}

// printCluster renders the cluster section as tables.
func printCluster(w io.Writer, v any, now time.Time) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var probe struct {
		Election string `json:"election"`
	}
	if json.Unmarshal(b, &probe) == nil && probe.Election == "lease" {
		return printLease(w, b, now)
	}
	// A daemon of an earlier release (the gossip election): its JSON
	// (vipd status --json) has the details.
	fmt.Fprintf(w, "\ncluster:\t%s election (a vipd of an earlier release): see vipd status --json\n", cmp.Or(probe.Election, "gossip"))
	return nil
}

// describeTimeline is the status line of a failover timeline.
func describeTimeline(t vip.Timeline, now time.Time) string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
	var b strings.Builder
	fmt.Fprintf(&b, "%s from %s, %s", t.VIP, t.PrevHolder, ago(now, t.DecidedAt))
	fmt.Fprintf(&b, ", decision to bound %s", ms(t.BoundAt.Sub(t.DecidedAt)))
	if !t.AnnouncedAt.IsZero() {
		fmt.Fprintf(&b, ", bound to first announcement %s", ms(t.AnnouncedAt.Sub(t.BoundAt)))
	}
	return b.String()
}

func credentialStatus(c health.Credential) *CredentialStatus {
	cs := &CredentialStatus{Kind: c.Kind, Path: c.Path, Subject: c.Subject, Since: c.Since, Loaded: c.Loaded, CAFile: c.CAFile}
	if !c.NotAfter.IsZero() {
		na := c.NotAfter
		cs.NotAfter = &na
	}
	return cs
}

// describeCredential is the status line for the probe's credential.
func describeCredential(c *CredentialStatus, now time.Time) string {
	var b strings.Builder
	switch c.Kind {
	case health.CredentialNone:
		b.WriteString("none (anonymous probe")
		if c.Loaded {
			b.WriteString("; a credential was loaded before, so 401/403 fail")
		} else {
			b.WriteString("; 401 counts as healthy until a credential appears")
		}
		b.WriteString(")")
	default:
		fmt.Fprintf(&b, "%s %s", c.Kind, c.Path)
		if c.Subject != "" {
			fmt.Fprintf(&b, " (%s", c.Subject)
			if c.NotAfter != nil {
				fmt.Fprintf(&b, ", expires %s", c.NotAfter.UTC().Format(time.RFC3339))
			}
			b.WriteString(")")
		}
	}
	fmt.Fprintf(&b, " since %s", ago(now, c.Since))
	if c.CAFile != "" {
		fmt.Fprintf(&b, "; server verified with %s", c.CAFile)
	} else {
		b.WriteString("; server certificate not verified (loopback, no CA file yet)")
	}
	return b.String()
}

// printLease renders the lease election's section.
func printLease(w io.Writer, b []byte, now time.Time) error {
	var c cluster.LeaseStatusDoc
	if err := json.Unmarshal(b, &c); err != nil {
		return err
	}
	leader := c.Leader
	if leader == "" {
		leader = "unknown"
	}
	fmt.Fprintf(w, "\ncluster:\tlease election, %s (%s), leader %s, term %d, quorum %v\n", c.Role, c.State, leader, c.Term, c.Quorum)
	if c.LeaseLeft != "" {
		fmt.Fprintf(w, "leader lease:\t%s left\n", c.LeaseLeft)
	}
	for _, v := range slices.Sorted(maps.Keys(c.Broken)) {
		fmt.Fprintf(w, "CANNOT HOLD %s:\t%s\n", v, c.Broken[v])
	}
	fmt.Fprintf(w, "voters:\t%s\n", strings.Join(c.Voters, ", "))
	if len(c.Learners) > 0 {
		fmt.Fprintf(w, "learners:\t%s\n", strings.Join(c.Learners, ", "))
	}
	if len(c.Witnesses) > 0 {
		fmt.Fprintf(w, "witnesses:\t%s\n", strings.Join(c.Witnesses, ", "))
	}
	for _, v := range slices.Sorted(maps.Keys(c.LastHandover)) {
		r := c.LastHandover[v]
		state := "done"
		if !r.OK {
			state = "failed"
		}
		to := r.To
		if to == "" {
			to = "(not known here)"
		}
		fmt.Fprintf(w, "last handover %s:\t%s to %s %s (%v): %s\n", v, state, to, ago(now, r.At), r.Took.Round(time.Millisecond), r.Reason)
	}
	fmt.Fprintln(w, "\nMEMBER\tADDRESS\tALIVE\tHEALTHY\tELIGIBLE")
	for _, m := range c.Members {
		fmt.Fprintf(w, "%s\t%s\t%v\t%v\t%v\n", m.Name, m.Addr, m.Alive, m.Healthy, m.Eligible)
	}
	fmt.Fprintln(w, "\nADDRESS\tHOLDER\tLEASE LEFT HERE")
	for _, k := range slices.Sorted(maps.Keys(c.Holders)) {
		left := "-"
		if u, ok := c.Holds[k]; ok {
			left = u.Sub(now).Round(time.Millisecond).String()
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", k, c.Holders[k], left)
	}
	return nil
}
