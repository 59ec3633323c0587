package kube

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// poolConfig is a validated FloatingIPPool spec.
type poolConfig struct {
	ip      IPProvider
	dns     DNSProvider // nil without a usable dnsRecordSet
	dnsName string      // provider name of dns
	dnsSpec DNSRecordSet
	fqdn    string // "dns" metric label
	match   *matcher
	warning string // logged (FLIPOP ignores such a dnsRecordSet with a warning)
}

// validatePool applies FLIPOP's checks, with its status texts.
func (o *operator) validatePool(p *FloatingIPPool) (poolConfig, string) {
	var pc poolConfig
	if !o.prov.known(p.Spec.Provider) {
		return pc, fmt.Sprintf("unknown provider %q", p.Spec.Provider)
	}
	ipp, ok := o.prov.ip[p.Spec.Provider]
	if !ok {
		return pc, fmt.Sprintf("provider %q does not provide floating IPs", p.Spec.Provider)
	}
	pc.ip = ipp
	if len(p.Spec.IPs) == 0 && p.Spec.DesiredIPs == 0 {
		return pc, "ips or desiredIPs must be provided"
	}
	m, err := newMatcher(p.Spec.Match)
	if err != nil {
		return pc, err.Error()
	}
	pc.match = m
	if d := p.Spec.DNSRecordSet; d != nil {
		if d.Zone == "" || d.RecordName == "" {
			pc.warning = "dnsRecordSet ignored: zone and recordName are required"
			return pc, ""
		}
		name := d.Provider
		if name == "" {
			name = p.Spec.Provider
		}
		dp, ok := o.prov.dns[name]
		if !ok {
			if !o.prov.known(name) {
				return pc, fmt.Sprintf("unknown provider %q", name)
			}
			return pc, "FloatingIPPool dns referenced provider without dns capability"
		}
		pc.dns, pc.dnsName, pc.dnsSpec = dp, name, *d
		if pc.dnsSpec.TTL <= 0 {
			pc.dnsSpec.TTL = defaultDNSTTL
		}
		pc.fqdn = dp.RecordNameAndZoneToFQDN(d.Zone, d.RecordName)
	}
	return pc, ""
}

func (o *operator) poolEntry(key string) *poolEntry {
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.pools[key]
	if e == nil {
		e = &poolEntry{core: newPoolCore()}
		o.pools[key] = e
	}
	return e
}

// syncPool is one level-triggered pass over a FloatingIPPool.
func (o *operator) syncPool(ctx context.Context, key string) (time.Time, error) {
	obj, exists, err := o.poolInf.GetIndexer().GetByKey(key)
	if err != nil {
		return time.Time{}, fmt.Errorf("read cache: %w", err)
	}
	if !exists {
		// FLIPOP's choice, kept: a deleted pool leaves IPs, annotations and
		// records where they are.
		o.mu.Lock()
		delete(o.pools, key)
		o.mu.Unlock()
		return time.Time{}, nil
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return time.Time{}, fmt.Errorf("unexpected object %T in pool cache", obj)
	}
	var pool FloatingIPPool
	if err := fromUnstructured(u, &pool); err != nil {
		o.log.Warn("bad FloatingIPPool", "pool", key, "err", err)
		return time.Time{}, o.patchStatus(ctx, FloatingIPPoolResource.Resource, u, statusOf(u), FloatingIPPoolStatus{Error: "invalid object: " + err.Error()})
	}
	ctx = withObject(ctx, objectRef{kind: "FloatingIPPool", namespace: pool.Namespace, name: pool.Name})
	e := o.poolEntry(key)
	if e.provider != pool.Spec.Provider || e.region != pool.Spec.Region {
		// FLIPOP resets a pool whose provider or region changes.
		e.core, e.provider, e.region = newPoolCore(), pool.Spec.Provider, pool.Spec.Region
		e.dns = dnsSync{}
	}
	pc, verr := o.validatePool(&pool)
	if pc.warning != e.warning {
		if pc.warning != "" {
			o.log.Warn("FloatingIPPool dnsRecordSet ignored", "pool", key, "reason", pc.warning)
		}
		e.warning = pc.warning
	}
	if verr != "" {
		o.log.Warn("FloatingIPPool not usable", "pool", key, "reason", verr)
		o.setPoolMetrics(key, poolSnapshot{})
		return time.Time{}, o.patchStatus(ctx, FloatingIPPoolResource.Resource, u, pool.Status, FloatingIPPoolStatus{Error: verr})
	}
	core := e.core
	now := o.now()
	coolOff := time.Duration(pool.Spec.AssignmentCoolOffSeconds * float64(time.Second))
	core.setSpec(pool.Spec.IPs, pool.Spec.DesiredIPs, coolOff, o.otherPoolsIPs(key), now)
	if se := core.sharedError(); se != e.shared {
		if se != "" {
			o.log.Warn("FloatingIPPool shares IPs with another pool", "pool", key, "reason", se)
		}
		e.shared = se
	}
	var retrySoon time.Time

	// 1. Create reserved IPs up to desiredIPs and persist them in spec.ips.
	for n := core.toCreate(len(pool.Spec.IPs), pool.Spec.DesiredIPs, now); n > 0; n-- {
		ip, err := pc.ip.CreateIP(ctx, pool.Spec.Region)
		core.created(ip, err, o.now())
		if err != nil {
			o.log.Error("create reserved IP failed", "pool", key, "region", pool.Spec.Region, "err", err)
			break
		}
		o.log.Info("created reserved IP", "pool", key, "ip", ip)
	}
	if len(core.pending) > 0 {
		if err := o.persistIPs(ctx, u, append(append([]string{}, pool.Spec.IPs...), core.pending...)); err != nil {
			o.log.Warn("could not write new IPs to spec.ips, will retry", "pool", key, "err", err)
			retrySoon = o.now().Add(time.Second)
		}
	}

	// 2. Read the IPs that are due from the provider.
	for _, ip := range core.dueChecks(now) {
		owner, err := pc.ip.IPToProviderID(ctx, ip)
		if ctx.Err() != nil {
			return time.Time{}, nil
		}
		if err != nil && !errors.Is(err, ErrInProgress) {
			o.log.Warn("reading reserved IP failed", "pool", key, "ip", ip, "err", err)
		}
		core.observe(ip, owner, err, o.now())
	}

	// 3. Match nodes, then pair nodes without an IP with IPs not active.
	nodes, err := o.enabledNodes(pc.match)
	if err != nil {
		return time.Time{}, err
	}
	pn := make([]poolNode, 0, len(nodes))
	for _, n := range nodes {
		pn = append(pn, poolNode{Name: n.Name, ProviderID: n.Spec.ProviderID})
	}
	now = o.now()
	core.setEnabled(pn, now)
	for {
		a, _, ok := core.nextAssignment(pn, now)
		if !ok {
			break
		}
		err := pc.ip.AssignIP(ctx, a.IP, a.Node.ProviderID)
		if ctx.Err() != nil {
			return time.Time{}, nil
		}
		if err != nil && !errors.Is(err, ErrInProgress) {
			o.log.Error("assign reserved IP failed", "pool", key, "ip", a.IP, "node", a.Node.Name, "err", err)
		} else {
			o.log.Info("assigned reserved IP", "pool", key, "ip", a.IP, "node", a.Node.Name, "providerID", a.Node.ProviderID)
		}
		now = o.now()
		core.assigned(a, err, now)
	}

	// 4. Annotations: set on holders, removed from nodes that lost the IP.
	if err := o.syncAnnotations(ctx, key, core, pn); err != nil {
		o.log.Warn("annotating nodes failed, will retry", "pool", key, "err", err)
		retrySoon = earliest(retrySoon, o.now().Add(5*time.Second))
	}

	// 5. DNS: the active IPs, never an empty set.
	var dnsWake time.Time
	if pc.dns != nil {
		dk := fmt.Sprintf("%s|%s|%s|%d", pc.dnsName, pc.dnsSpec.Zone, pc.dnsSpec.RecordName, pc.dnsSpec.TTL)
		if dk != e.dnsKey {
			e.dns, e.dnsKey = dnsSync{}, dk
		}
		if want := core.activeIPs(pn); len(want) > 0 {
			write, at := e.dns.decide(want, o.now(), o.timing)
			if write {
				err := pc.dns.EnsureDNSARecordSet(ctx, pc.dnsSpec.Zone, pc.dnsSpec.RecordName, want, pc.dnsSpec.TTL)
				if ctx.Err() != nil {
					return time.Time{}, nil
				}
				e.dns.done(err, o.now())
				if err != nil {
					o.log.Error("updating DNS failed", "pool", key, "record", pc.fqdn, "err", err)
				} else {
					o.log.Info("DNS record set written", "pool", key, "record", pc.fqdn, "ips", want)
				}
				_, at = e.dns.decide(want, o.now(), o.timing)
			}
			dnsWake = at
		}
	}

	// 6. Status and metrics. Like FLIPOP, DNS problems of a pool are
	// logged (above), not put in status.error.
	now = o.now()
	st := core.status(pn)
	o.setPoolMetrics(key, core.snapshot(&pool, pc.fqdn, pn))
	if err := o.patchStatus(ctx, FloatingIPPoolResource.Resource, u, pool.Status, st); err != nil {
		return time.Time{}, err
	}
	return earliest(core.nextWake(pn, now), dnsWake, retrySoon, now.Add(reconcilePeriod)), nil
}

// persistIPs writes spec.ips (FLIPOP's way of remembering created IPs).
// The update carries the cached resourceVersion, so a concurrent edit makes
// it fail and the next pass retries with the fresh object.
func (o *operator) persistIPs(ctx context.Context, u *unstructured.Unstructured, ips []string) error {
	c := u.DeepCopy()
	if err := unstructured.SetNestedStringSlice(c.Object, ips, "spec", "ips"); err != nil {
		return fmt.Errorf("set spec.ips: %w", err)
	}
	_, err := o.dyn.Resource(FloatingIPPoolResource).Namespace(c.GetNamespace()).Update(ctx, c, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("update spec.ips of %s/%s: %w", c.GetNamespace(), c.GetName(), err)
	}
	return nil
}

// syncAnnotations makes the reserved-IP annotation of every node agree with
// the pool: holders carry their IP; any other node (whatever the reason it
// does not hold one: it left the nodeLabel selector, got a taint, is not
// Ready, lost its pods) loses an annotation naming one of the pool's IPs.
// Annotations naming IPs of no pool of ours, or of another pool, are never
// touched. Nodes already right are not patched.
func (o *operator) syncAnnotations(ctx context.Context, key string, core *poolCore, pn []poolNode) error {
	want := core.annotations(pn)
	all, err := o.nodes.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	var errs []error
	for _, n := range all {
		cur, has := n.Annotations[ReservedIPAnnotation]
		ip, holds := want[n.Name]
		switch {
		case holds && cur != ip:
			o.log.Info("annotating node", "pool", key, "node", n.Name, "ip", ip)
			errs = append(errs, o.setAnnotation(ctx, n.Name, ip))
		case !holds && has && core.ownsAnnotation(cur):
			o.log.Info("removing node annotation", "pool", key, "node", n.Name, "ip", cur)
			errs = append(errs, o.setAnnotation(ctx, n.Name, ""))
		}
	}
	return errors.Join(errs...)
}

// otherPoolsIPs maps every IP listed in spec.ips of a pool other than key
// to that pool's key (the first by key when several list it).
func (o *operator) otherPoolsIPs(key string) map[string]string {
	out := map[string]string{}
	keys := o.poolInf.GetStore().ListKeys()
	sort.Strings(keys)
	for _, k := range keys {
		if k == key {
			continue
		}
		obj, ok, err := o.poolInf.GetStore().GetByKey(k)
		if err != nil || !ok {
			continue
		}
		u, isU := obj.(*unstructured.Unstructured)
		if !isU {
			continue
		}
		ips, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "ips")
		for _, ip := range ips {
			if ip != "" && out[ip] == "" {
				out[ip] = k
			}
		}
	}
	return out
}

// statusOf decodes whatever status a (possibly malformed) object has, for
// the no-op comparison.
func statusOf(u *unstructured.Unstructured) any {
	st, _, _ := unstructured.NestedFieldNoCopy(u.Object, "status")
	return st
}
