package cluster

import "encoding/json"

// oldMeta is the part of the memberlist metadata of the previous release
// (the gossip election) that the lease election reads during a rolling
// upgrade: the addresses such a node claims ("v", a list of prefixes),
// which the leader never grants while it is alive (docs/lease.md, the
// upgrade meeting). The lease election's own metadata carries "v" as a
// version number, which does not decode here.
type oldMeta struct {
	Holding []string `json:"v,omitempty"`
}

// oldClaims returns the addresses a member of the previous release claims
// in its metadata b; ok is false for metadata in another format.
func oldClaims(b []byte) (claims []string, ok bool) {
	if len(b) == 0 {
		return nil, true
	}
	var m oldMeta
	if json.Unmarshal(b, &m) != nil {
		return nil, false
	}
	return m.Holding, true
}
