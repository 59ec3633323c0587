package bgp

import "github.com/vipd/vipd/vip"

// The speaker is the bgp-mode announcer.
var _ vip.Announcer = (*Speaker)(nil)
