package main

import (
	"net/netip"

	"context"
	"encoding/json"
	"flag"
	"fmt"
	"github.com/vishvananda/netlink"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vipd/vipd/lab"
)

// window is the part of a run drawn in the timeline.
type window struct {
	Scenario string        `json:"scenario"`
	Fault    time.Time     `json:"fault"`
	Answers  []lab.Answer  `json:"-"`
	Outage   time.Duration `json:"-"`
}

// scenarioResult is one row of the table: one scenario, one contender.
type scenarioResult struct {
	Name    string    `json:"name"`
	Impl    string    `json:"impl,omitempty"`
	Target  string    `json:"target,omitempty"`
	LimitMS float64   `json:"limit_ms,omitempty"`
	Beat    string    `json:"beat,omitempty"`
	RunsMS  []float64 `json:"runs_ms"`
	// ReleaseMS is, per run, fault to the old holder's VIP leaving it (the
	// detection part of the outage); empty where the VIP may stay.
	ReleaseMS []float64 `json:"release_ms,omitempty"`
	// HandoverMS is outage minus release: the election, bind and announce.
	HandoverMedianMS float64 `json:"handover_median_ms,omitempty"`
	HandoverMaxMS    float64 `json:"handover_max_ms,omitempty"`
	MedianMS         float64 `json:"median_ms"`
	MaxMS            float64 `json:"max_ms"`
	// Met is set when the row has a target: max <= limit, and a median
	// below Beat's when Beat is set. Reference rows (keepalived) have none.
	Met  *bool  `json:"target_met,omitempty"`
	Note string `json:"note,omitempty"`
}

type benchReport struct {
	When      time.Time        `json:"when"`
	Runs      int              `json:"runs"`
	Scenarios []scenarioResult `json:"scenarios"`
	Idle      []idleResult     `json:"idle,omitempty"`
	Stress    []stressResult   `json:"stress,omitempty"`
}

func bench(ctx context.Context, args []string) (err error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	out := fs.String("out", "out", "directory for bench.json and timeline.svg")
	runs := fs.Int("runs", 5, "runs per scenario and contender")
	only := fs.String("scenarios", "", "comma list of scenarios to run (default all): "+scenarioNames())
	onlyImpl := fs.String("impls", "", "comma list of contenders (default all): "+implNames())
	logs := fs.String("logs", "", "directory to write every daemon's log into")
	stressFor := fs.Duration("stress", 10*time.Minute, "length of the false-failover run under stress-ng ($VIPD_BENCH_STRESS overrides, e.g. 1m for a quick check)")
	idleFor := fs.Duration("idle", defaultIdle, "how long the idle cost is measured")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if v := os.Getenv("VIPD_BENCH_STRESS"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return fmt.Errorf("VIPD_BENCH_STRESS=%q: want a duration such as 10m or 1m", v)
		}
		*stressFor = d
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	want, wantImpl := set(*only), set(*onlyImpl)
	var contenders []impl
	for _, i := range impls {
		if len(wantImpl) == 0 || wantImpl[i.name] {
			contenders = append(contenders, i)
		}
	}
	for _, i := range contenders {
		if i.keepalived() {
			if _, err := keepalivedBinary(); err != nil {
				return err
			}
		}
	}
	rep := benchReport{When: time.Now().UTC(), Runs: *runs}
	var windows []window
	for _, f := range faults {
		if len(want) > 0 && !want[f.name] {
			continue
		}
		for _, i := range contenders {
			res, ws, err := runScenario(ctx, f, i, *runs, *logs)
			if err != nil {
				return fmt.Errorf("%s / %s: %w", f.name, i.name, err)
			}
			rep.Scenarios = append(rep.Scenarios, res)
			windows = append(windows, ws...)
		}
	}
	judge(rep.Scenarios)
	if len(want) == 0 || want["first-node-bind"] {
		res, err := firstNodeBind(ctx, *runs)
		if err != nil {
			return fmt.Errorf("first-node-bind: %w", err)
		}
		rep.Scenarios = append(rep.Scenarios, res)
	}
	if len(want) == 0 || want["idle"] {
		for _, i := range contenders {
			idle, err := measureIdle(ctx, i, *idleFor)
			if err != nil {
				return fmt.Errorf("idle %s: %w", i.name, err)
			}
			rep.Idle = append(rep.Idle, idle)
			if i.name == "vipd-default" {
				idle, err := measureIdle(ctx, idleChecksOff, *idleFor)
				if err != nil {
					return fmt.Errorf("idle %s: %w", idleChecksOff.name, err)
				}
				rep.Idle = append(rep.Idle, idle)
			}
		}
	}
	if len(want) == 0 || want["stress"] {
		st, err := stressRun(ctx, *stressFor, *logs)
		if err != nil {
			return fmt.Errorf("stress: %w", err)
		}
		rep.Stress = st
	}
	printReport(rep)
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	jsonPath := filepath.Join(*out, "bench.json")
	if err := os.WriteFile(jsonPath, append(b, '\n'), 0o644); err != nil {
		return err
	}
	svgPath := filepath.Join(*out, "timeline.svg")
	if err := os.WriteFile(svgPath, []byte(timelineSVG(windows)), 0o644); err != nil {
		return err
	}
	fmt.Printf("\nwrote %s and %s\n", jsonPath, svgPath)
	return nil
}

func set(list string) map[string]bool {
	m := map[string]bool{}
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s != "" {
			m[s] = true
		}
	}
	return m
}

func scenarioNames() string {
	var n []string
	for _, f := range faults {
		n = append(n, f.name)
	}
	return strings.Join(append(n, "first-node-bind", "idle", "stress"), ",")
}

// judge sets Met on every row with a target: its max within the limit and,
// with beat, its median below the beaten contender's in the same scenario.
func judge(rows []scenarioResult) {
	for i := range rows {
		r := &rows[i]
		if r.LimitMS == 0 {
			continue
		}
		met := r.MaxMS <= r.LimitMS
		if r.Beat != "" {
			found := false
			for _, o := range rows {
				if o.Name == r.Name && o.Impl == r.Beat {
					found = true
					met = met && r.MedianMS < o.MedianMS
				}
			}
			if !found {
				r.Note = "not compared: " + r.Beat + " did not run"
			}
		}
		r.Met = &met
	}
}

// runScenario measures one fault runs times on a fresh 3-node lab running
// one contender.
func runScenario(ctx context.Context, f fault, im impl, runs int, logs string) (res scenarioResult, windows []window, err error) {
	t := &tb{}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
		t.close()
	}()
	tg := f.targets[im.name]
	res = scenarioResult{Name: f.name, Impl: im.name, Target: tg.text, LimitMS: ms(tg.limit), Beat: tg.beat}
	fmt.Fprintf(os.Stderr, "== %s / %s: %s (%d runs)\n", f.name, im.name, f.what, runs)
	env := append([]string(nil), im.env...)
	if f.name == "api" {
		env = append(env, im.apiEnv...)
	}
	c, err := newCluster(ctx, t, 3, env...)
	if err != nil {
		return res, nil, err
	}
	c.impl = im
	if err := c.start(); err != nil {
		return res, nil, err
	}
	defer c.dumpLogs(logs, f.name+"-"+im.name)
	prober := c.Client.StartProber(c.vip.String()+":6443", 10*time.Millisecond, 500*time.Millisecond)
	defer prober.Stop()
	for i := 0; i < runs; i++ {
		if err := c.waitConverged(ctx, 30*time.Second); err != nil {
			return res, nil, fmt.Errorf("run %d: %w", i+1, err)
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		holder, err := c.stableHolder(sctx, 1500*time.Millisecond)
		cancel()
		if err != nil {
			c.quit() // goroutine dumps into the logs
			return res, nil, err
		}
		faultAt := time.Now()
		if err := f.apply(ctx, c, holder); err != nil {
			return res, nil, err
		}
		// Wait until the VIP left the old holder (after a restart it may
		// come back to it later), then until it settled.
		if err := c.waitMoved(ctx, holder, faultAt, 30*time.Second); err != nil {
			return res, nil, fmt.Errorf("run %d: %w", i+1, err)
		}
		settle := 30 * time.Second
		if im.keepalived() && f.name == "kill" {
			settle = 8 * time.Second
		}
		sctx, cancel = context.WithTimeout(ctx, settle)
		newHolder, err := c.stableHolder(sctx, time.Second)
		cancel()
		if err != nil && im.keepalived() && f.name == "kill" {
			// A killed keepalived leaves its VIP bound, and the restarted
			// one (BACKUP) does not remove it: two nodes answer for good.
			// The bench removes it, as an operator would have to.
			if derr := c.node(holder).Run(func() error { return delAddr(c.node(holder).Link, c.vip) }); derr != nil {
				return res, nil, fmt.Errorf("run %d: removing the stale VIP on %s: %w", i+1, holder, derr)
			}
			res.Note = "the VIP stayed bound on the killed node after keepalived restarted (two holders); the bench removed it"
			sctx, cancel = context.WithTimeout(ctx, 30*time.Second)
			newHolder, err = c.stableHolder(sctx, time.Second)
			cancel()
		}
		if err != nil {
			return res, nil, fmt.Errorf("run %d: %w", i+1, err)
		}
		gap, before, after := lab.Outage(prober.Answers(), faultAt.Add(-100*time.Millisecond), time.Now())
		res.RunsMS = append(res.RunsMS, ms(gap))
		if rel := c.releasedAt(holder, faultAt); !rel.IsZero() && f.handover {
			res.ReleaseMS = append(res.ReleaseMS, ms(rel.Sub(faultAt)))
		}
		// The holder before the fault and the one the VIP settled on; the
		// outage is the largest gap between answers, which need not be
		// the switch itself (a planned stop's largest gap may fall before
		// it, between two answers of the old holder).
		fmt.Fprintf(os.Stderr, "   run %d: holder %s -> %s, client outage %v (largest gap between answers from %s and %s)\n", i+1, holder, newHolder, gap.Round(time.Millisecond), before, after)
		if tg.limit > 0 && gap > tg.limit {
			// Over the target: what the client's probes in the gap met.
			seen := map[string]bool{}
			for _, a := range prober.Answers() {
				if a.Err != "" && !a.Sent.Before(faultAt.Add(-100*time.Millisecond)) && !seen[a.Err] && len(seen) < 4 {
					seen[a.Err] = true
					fmt.Fprintf(os.Stderr, "      probe sent %v after the fault: %s\n", a.Sent.Sub(faultAt).Round(time.Millisecond), a.Err)
				}
			}
		}
		if i == 0 {
			var ans []lab.Answer
			for _, a := range prober.Answers() {
				if a.Sent.After(faultAt.Add(-time.Second)) && a.Sent.Before(faultAt.Add(5*time.Second)) {
					ans = append(ans, a)
				}
			}
			windows = append(windows, window{Scenario: f.name + " / " + im.name, Fault: faultAt, Answers: ans, Outage: gap})
		}
		if err := c.restore(ctx); err != nil {
			return res, nil, err
		}
	}
	res.MedianMS, res.MaxMS = median(res.RunsMS), maxOf(res.RunsMS)
	if len(res.ReleaseMS) == len(res.RunsMS) && len(res.RunsMS) > 0 {
		var hand []float64
		for i := range res.RunsMS {
			hand = append(hand, res.RunsMS[i]-res.ReleaseMS[i])
		}
		res.HandoverMedianMS, res.HandoverMaxMS = median(hand), maxOf(hand)
	}
	return res, windows, nil
}

// firstNodeBind measures, on a lone node, the time from the fake
// apiserver's first healthy answer to the first gratuitous ARP the client
// captures.
func firstNodeBind(ctx context.Context, runs int) (res scenarioResult, err error) {
	res = scenarioResult{Name: "first-node-bind", Target: "<= 200 ms from first healthy answer to first GARP at the client", LimitMS: 200}
	fmt.Fprintf(os.Stderr, "== first-node-bind (%d runs)\n", runs)
	for i := 0; i < runs; i++ {
		d, err := firstNodeBindOnce(ctx, i)
		if err != nil {
			return res, err
		}
		res.RunsMS = append(res.RunsMS, ms(d))
		fmt.Fprintf(os.Stderr, "   run %d: %v\n", i+1, d.Round(100*time.Microsecond))
	}
	res.MedianMS, res.MaxMS = median(res.RunsMS), maxOf(res.RunsMS)
	met := res.MaxMS <= res.LimitMS
	res.Met = &met
	return res, nil
}

func firstNodeBindOnce(ctx context.Context, i int) (d time.Duration, err error) {
	t := &tb{}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
		t.close()
	}()
	c, err := newCluster(ctx, t, 1)
	if err != nil {
		return 0, err
	}
	n := c.Nodes[0]
	api := c.apis[n.Name]
	if err := api.SetMode(lab.Down); err != nil {
		return 0, err
	}
	capt, err := c.Client.StartCapture(ctx, "arp")
	if err != nil {
		return 0, err
	}
	p, err := n.StartVipd(c.bin, "VIPD_ADDRESS="+c.vip.String()+"/32", "VIPD_LOG_LEVEL=info", "VIPD_NICE=-10")
	if err != nil {
		return 0, err
	}
	time.Sleep(1500 * time.Millisecond) // running, apiserver down
	if err := api.SetMode(lab.OK); err != nil {
		return 0, err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	frames, err := capt.WaitFrames(wctx, 1, "Reply "+c.vip.String()+" is-at")
	if err != nil {
		return 0, fmt.Errorf("%w\nvipd:\n%s", err, p.Output())
	}
	first := api.FirstOK()
	if first.IsZero() {
		return 0, fmt.Errorf("apiserver never answered 200")
	}
	_ = i
	return frames[0].At.Sub(first), nil
}

func rssMB(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			kb, _ := strconv.ParseFloat(strings.Fields(line)[1], 64)
			return kb / 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS")
}

func printReport(r benchReport) {
	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tCONTENDER\tRUNS\tOUTAGE MEDIAN\tOUTAGE MAX\tRELEASE->SERVED MEDIAN/MAX\tTARGET\tMET")
	for _, s := range r.Scenarios {
		met := "-"
		if s.Met != nil {
			met = "yes"
			if !*s.Met {
				met = "NO"
			}
		}
		if s.Note != "" {
			met += " (" + s.Note + ")"
		}
		hand := "-"
		if s.HandoverMaxMS > 0 {
			hand = fmt.Sprintf("%.0f / %.0f ms", s.HandoverMedianMS, s.HandoverMaxMS)
		}
		impl, target := s.Impl, s.Target
		if impl == "" {
			impl = "vipd-default"
		}
		if target == "" {
			target = "(reference)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f ms\t%.0f ms\t%s\t%s\t%s\n", s.Name, impl, len(s.RunsMS), s.MedianMS, s.MaxMS, hand, target, met)
	}
	_ = tw.Flush()
	if len(r.Idle) > 0 {
		fmt.Println()
		tw = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "IDLE (3-node l2 cluster)\tRSS PER NODE (MEAN / MAX; PEAK SAMPLE)\tCPU PER NODE (MEAN / MAX, % OF ONE CORE)\tRUNS/S PER NODE (MEAN / MAX; CPU PER RUN)\tARP+ND FRAMES/S\tTARGET\tMET")
		for _, i := range r.Idle {
			met := "-"
			if i.Met != nil {
				met = "yes"
				if !*i.Met {
					met = "NO"
				}
			}
			target := i.Target
			if target == "" {
				target = "(reference)"
			}
			fmt.Fprintf(tw, "%s\t%.1f / %.1f MB; %.1f MB\t%.2f / %.2f %%\t%.1f / %.1f; %.0f us\t%.1f\t%s\t%s\n", i.Impl, i.RSSMeanMB, i.RSSMaxMB, maxOf(i.RSSPeakMB), i.CPUMeanPct, i.CPUMaxPct, mean(i.RunsPerSecond), maxOf(i.RunsPerSecond), mean(i.CPUPerRunUS), i.NeighbourFPS, target, met)
		}
		_ = tw.Flush()
	}
	for _, s := range r.Stress {
		met := "yes"
		if s.Failovers > 0 {
			met = "NO"
		}
		fmt.Printf("\nstress (%d nodes, %s, stress-ng on %d cores, %v): %d failovers, %d lateness warnings (target: no failover): %s\n",
			s.Nodes, s.Profile, s.StressCores, time.Duration(s.Seconds*float64(time.Second)).Round(time.Second), s.Failovers, s.Late, met)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func maxOf(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		if x > m {
			m = x
		}
	}
	return m
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

// timelineSVG draws, for the first run of each scenario, which node
// answered each client probe around the fault (red line).
func timelineSVG(ws []window) string {
	const (
		left, right = 180.0, 20.0
		width       = 1000.0
		rowH        = 70.0
		before      = time.Second
		span        = 6 * time.Second
	)
	colors := map[string]string{"n1": "#1f77b4", "n2": "#2ca02c", "n3": "#9467bd", "": "#d62728"}
	h := 60 + rowH*float64(len(ws)) + 40
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", width, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="10" y="20" font-size="15">failover side by side (vipd, keepalived): who answered each client probe (a fresh TLS connection every 10 ms) around the fault</text>`+"\n")
	plotW := width - left - right
	x := func(d time.Duration) float64 { return left + plotW*float64(d+before)/float64(span) }
	for s := 0; s <= 6; s++ {
		d := time.Duration(s)*time.Second - before
		fmt.Fprintf(&b, `<line x1="%.1f" y1="35" x2="%.1f" y2="%.0f" stroke="#ddd"/><text x="%.1f" y="%.0f" text-anchor="middle">%+ds</text>`+"\n",
			x(d), x(d), h-35, x(d), h-20, s-1)
	}
	for i, w := range ws {
		y := 50 + rowH*float64(i)
		fmt.Fprintf(&b, `<text x="10" y="%.0f">%s</text><text x="10" y="%.0f" fill="#666">outage %v</text>`+"\n", y+20, w.Scenario, y+36, w.Outage.Round(time.Millisecond))
		for _, a := range w.Answers {
			d := a.Sent.Sub(w.Fault)
			if d < -before || d > span-before {
				continue
			}
			row := 0.0
			if a.Node != "" {
				n, _ := strconv.Atoi(strings.TrimPrefix(a.Node, "n"))
				row = float64(n)
			}
			col, ok := colors[a.Node]
			if !ok {
				col = "#888"
			}
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="1.6" height="10" fill="%s"/>`+"\n", x(d), y+row*12, col)
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="red" stroke-width="2"/>`+"\n", x(0), y-5, x(0), y+55)
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" fill="#d62728">row 0 red: no answer</text><text x="%.0f" y="%.0f">rows 1-3: answered by n1 (blue), n2 (green), n3 (purple); red line: fault</text>`+"\n", left, h-5, left+160, h-5)
	b.WriteString("</svg>\n")
	return b.String()
}

// delAddr removes vip/32 from the link (in the calling thread's namespace).
func delAddr(link string, vip netip.Addr) error {
	l, err := netlink.LinkByName(link)
	if err != nil {
		return err
	}
	a, err := netlink.ParseAddr(vip.String() + "/32")
	if err != nil {
		return err
	}
	return netlink.AddrDel(l, a)
}
