// Package bgp is vipd's bgp mode: an embedded GoBGP (v3) speaker that
// advertises each VIP this node holds as a /32 or /128 to its routers, so
// the router spreads traffic over every healthy node (ECMP).
//
// The Speaker implements vip.Announcer. Acquire binds the VIP on lo (so the
// node accepts traffic for it) and advertises it with an unspecified next
// hop, which GoBGP replaces with the local address of each session; IPv4
// VIPs go to IPv4 peers and IPv6 VIPs to IPv6 peers. Release withdraws the
// path and removes the address. Sessions are active only (vipd dials the
// router, it does not listen unless Config.ListenPort is set), every route
// the router sends is rejected on import, graceful restart is off unless
// asked for, and a reset peer reconnects after one second instead of
// GoBGP's 30.
//
// BFDLink connects BFD sessions (package bfd, through the small BFDEvent
// type so neither package imports the other) to the BGP sessions they
// protect: a BFD Down hard-resets the session to that router at once.
//
// ParsePeers reads the VIPD_BGP_PEERS syntax; its errors name the setting,
// the offending value and the accepted form.
package bgp
