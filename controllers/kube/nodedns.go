package kube

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// nodeDNSConfig is a validated NodeDNSRecordSet spec.
type nodeDNSConfig struct {
	dns      DNSProvider
	provider string
	spec     DNSRecordSet
	fqdn     string
	match    *matcher
}

// validateNodeDNS applies FLIPOP's checks with its status texts. The
// provider is dnsRecordSet.provider, else spec.provider (where FLIPOP's own
// README puts it), else digitalocean, as FLIPOP's README promises.
func (o *operator) validateNodeDNS(s *NodeDNSRecordSet) (nodeDNSConfig, string) {
	var c nodeDNSConfig
	name := s.Spec.DNSRecordSet.Provider
	if name == "" {
		name = s.Spec.Provider
	}
	if name == "" {
		name = ProviderDigitalOcean
	}
	if !o.prov.known(name) {
		return c, fmt.Sprintf("unknown provider %q", name)
	}
	dp, ok := o.prov.dns[name]
	if !ok {
		return c, fmt.Sprintf("provider %q does not provide DNS", name)
	}
	if s.Spec.DNSRecordSet.Zone == "" || s.Spec.DNSRecordSet.RecordName == "" {
		return c, "invalid dnsRecordSet specification"
	}
	m, err := newMatcher(s.Spec.Match)
	if err != nil {
		return c, err.Error() // "Error parsing node selector: ...", as FLIPOP writes it
	}
	c.dns, c.provider, c.spec, c.match = dp, name, s.Spec.DNSRecordSet, m
	c.fqdn = dp.RecordNameAndZoneToFQDN(c.spec.Zone, c.spec.RecordName)
	return c, ""
}

func (o *operator) dnsEntry(key string) *dnsEntry {
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.dnsSets[key]
	if e == nil {
		e = &dnsEntry{}
		o.dnsSets[key] = e
	}
	return e
}

// syncNodeDNS is one pass over a NodeDNSRecordSet: the record set holds the
// chosen address of every matching node; an empty set deletes the records
// (FLIPOP's behaviour). Writes are debounced and re-asserted periodically.
func (o *operator) syncNodeDNS(ctx context.Context, key string) (time.Time, error) {
	obj, exists, err := o.dnsInf.GetIndexer().GetByKey(key)
	if err != nil {
		return time.Time{}, fmt.Errorf("read cache: %w", err)
	}
	if !exists {
		o.mu.Lock()
		delete(o.dnsSets, key)
		o.mu.Unlock()
		return time.Time{}, nil
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return time.Time{}, fmt.Errorf("unexpected object %T in record set cache", obj)
	}
	var rs NodeDNSRecordSet
	if err := fromUnstructured(u, &rs); err != nil {
		o.log.Warn("bad NodeDNSRecordSet", "recordset", key, "err", err)
		return time.Time{}, o.patchStatus(ctx, NodeDNSRecordSetResource.Resource, u, statusOf(u),
			NodeDNSRecordSetStatus{State: DNSStateError, Error: "invalid object: " + err.Error()})
	}
	ctx = withObject(ctx, objectRef{kind: "NodeDNSRecordSet", namespace: rs.Namespace, name: rs.Name})
	e := o.dnsEntry(key)
	c, verr := o.validateNodeDNS(&rs)
	if verr != "" {
		// Like FLIPOP, the records series of a set that turned invalid
		// stays at its last value.
		o.log.Warn("NodeDNSRecordSet not usable", "recordset", key, "reason", verr)
		return time.Time{}, o.patchStatus(ctx, NodeDNSRecordSetResource.Resource, u, rs.Status,
			NodeDNSRecordSetStatus{State: DNSStateError, Error: verr})
	}
	dk := fmt.Sprintf("%s|%s|%s|%d|%s", c.provider, c.spec.Zone, c.spec.RecordName, c.spec.TTL, rs.Spec.AddressType)
	if dk != e.dnsKey {
		e.dns, e.dnsKey = dnsSync{}, dk
	}
	nodes, err := o.enabledNodes(c.match)
	if err != nil {
		return time.Time{}, err
	}
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, nodeAddresses(n, rs.Spec.AddressType)...)
	}
	want := sortedUnique(addrs)
	write, wake := e.dns.decide(want, o.now(), o.timing)
	if write {
		err := c.dns.EnsureDNSARecordSet(ctx, c.spec.Zone, c.spec.RecordName, want, c.spec.TTL)
		if ctx.Err() != nil {
			return time.Time{}, nil
		}
		e.dns.done(err, o.now())
		if err != nil {
			o.log.Error("updating DNS failed", "recordset", key, "record", c.fqdn, "err", err)
		} else {
			o.log.Info("DNS record set written", "recordset", key, "record", c.fqdn, "ips", want)
		}
		_, wake = e.dns.decide(want, o.now(), o.timing)
	}
	st := NodeDNSRecordSetStatus{State: DNSStateInProgress}
	switch {
	case e.dns.lastErr != nil:
		// FLIPOP's texts: still in progress (it is retried), with the error.
		st = NodeDNSRecordSetStatus{State: DNSStateInProgress, Error: fmt.Sprintf("Failed to update DNS: %.1000s", e.dns.lastErr.Error())}
	case e.dns.wroteOnce:
		st.State = DNSStateActive
	}
	o.setDNSMetrics(key, dnsSnapshot{
		namespace: rs.Namespace, name: rs.Name, provider: c.provider, dns: c.fqdn,
		records: len(e.dns.written), valid: true,
	})
	if err := o.patchStatus(ctx, NodeDNSRecordSetResource.Resource, u, rs.Status, st); err != nil {
		return time.Time{}, err
	}
	return earliest(wake, o.now().Add(reconcilePeriod)), nil
}
