package migrate

// otherKind says what happens to a kube-vip setting the translation does
// not map to a VIPD_* variable.
type otherKind int

const (
	// kindDead: kube-vip never read it (or no longer does): always a warning.
	kindDead otherKind = iota + 1
	// kindFeature: a switch for a feature vipd does not have: a warning
	// when it is on, a note when it is off.
	kindFeature
	// kindFeatureSetting: a setting used only by a feature vipd does not
	// have: a warning when the feature switch (feature field) is on,
	// otherwise a note.
	kindFeatureSetting
	// kindChanged: vipd behaves differently and has no setting: a warning
	// when it is set to anything but its off value, otherwise a note.
	kindChanged
	// kindIrrelevant: has no meaning for vipd: a note.
	kindIrrelevant
)

type otherVar struct {
	kind otherKind
	// feature names the feature (kindFeature, kindFeatureSetting).
	feature string
	// why is the explanation written into the note or the warning.
	why string
}

const (
	featServices   = "Services of type LoadBalancer (svc_enable)"
	featLB         = "IPVS load balancing in front of the control plane (lb_enable)"
	featRT         = "routing-table mode (vip_routingtable)"
	featWireGuard  = "WireGuard mode (vip_wireguard)"
	featEgress     = "egress SNAT for Services"
	featDDNS       = "DHCP/DDNS-assigned VIPs (vip_ddns)"
	featZebra      = "FRR zebra integration (zebra_enable)"
	featUPnP       = "UPnP port forwarding (enable_upnp)"
	featLabel      = "node labelling with kube-vip.io/has-ip (enable_node_labeling)"
	featCPDetect   = "apiserver address auto-detection from certificate SANs (cp_detect)"
	servicesAdvice = "vipd manages control-plane VIPs only; keep kube-vip with cp_enable=false (or another LoadBalancer implementation such as MetalLB) for Services"
)

// kubeVIPOther lists every kube-vip setting that has no direct VIPD_*
// equivalent, with what to tell the operator. Settings the translation
// maps are handled in kubevip.go and are not listed here.
var kubeVIPOther = map[string]otherVar{
	// Dead or removed settings.
	"debounce_time":         {kind: kindDead, why: "kube-vip's generator writes debounce_time but kube-vip never reads it; it had no effect"},
	"vip_startleader":       {kind: kindDead, why: "vip_startleader is a leftover of kube-vip's removed raft mode; it had no effect"},
	"vip_singlenode":        {kind: kindDead, why: "vip_singlenode is a leftover of kube-vip's removed raft mode; it had no effect"},
	"vip_packet":            {kind: kindDead, why: "Equinix Metal EIP reassignment (vip_packet*) was removed in kube-vip v0.9.0; vipd's cloud mode supports DigitalOcean reserved IPs (VIPD_MODE=cloud)"},
	"vip_packetproject":     {kind: kindDead, why: "Equinix Metal EIP reassignment (vip_packet*) was removed in kube-vip v0.9.0; vipd's cloud mode supports DigitalOcean reserved IPs (VIPD_MODE=cloud)"},
	"vip_packetprojectid":   {kind: kindDead, why: "Equinix Metal EIP reassignment (vip_packet*) was removed in kube-vip v0.9.0; vipd's cloud mode supports DigitalOcean reserved IPs (VIPD_MODE=cloud)"},
	"provider_config":       {kind: kindDead, why: "provider_config (Equinix Metal credentials) was removed in kube-vip v0.9.0; vipd's cloud mode reads DIGITALOCEAN_ACCESS_TOKEN or VIPD_DO_TOKEN_FILE"},
	"enable_endpointslices": {kind: kindDead, why: "enable_endpointslices was removed in kube-vip v0.9.0 (inverted into enable_endpoints); it only concerned Services"},

	// Features vipd does not have.
	"svc_enable":           {kind: kindFeature, feature: featServices, why: servicesAdvice},
	"lb_enable":            {kind: kindFeature, feature: featLB, why: "vipd moves the VIP to a healthy apiserver; it does not balance connections across apiservers"},
	"vip_wireguard":        {kind: kindFeature, feature: featWireGuard, why: "vipd announces through ARP/NDP (l2), BGP or a cloud reserved IP"},
	"vip_ddns":             {kind: kindFeature, feature: featDDNS, why: "vipd needs fixed VIP addresses in VIPD_ADDRESS"},
	"zebra_enable":         {kind: kindFeature, feature: featZebra, why: "vipd's bgp mode speaks BGP to the routers itself"},
	"enable_upnp":          {kind: kindFeature, feature: featUPnP, why: "no equivalent"},
	"cp_detect":            {kind: kindFeature, feature: featCPDetect, why: "vipd checks the apiserver at VIPD_HEALTH_URL"},
	"enable_node_labeling": {kind: kindFeature, feature: featLabel, why: "the holder is visible in `vipd status`, the /status endpoint and the vipd_vip_held metric"},

	// Settings of those features.
	"svc_election":                   {kind: kindFeatureSetting, feature: featServices},
	"svc_leasename":                  {kind: kindFeatureSetting, feature: featServices},
	"svc_namespace":                  {kind: kindFeatureSetting, feature: featServices},
	"lb_class_only":                  {kind: kindFeatureSetting, feature: featServices},
	"lb_class_name":                  {kind: kindFeatureSetting, feature: featServices},
	"lb_class_legacy_handling":       {kind: kindFeatureSetting, feature: featServices},
	"per_service_election_on_demand": {kind: kindFeatureSetting, feature: featServices},
	"enable_service_security":        {kind: kindFeatureSetting, feature: featServices},
	"disable_service_updates":        {kind: kindFeatureSetting, feature: featServices},
	"enable_endpoints":               {kind: kindFeatureSetting, feature: featServices},
	"vip_servicesinterface":          {kind: kindFeatureSetting, feature: featServices},
	"vip_configmap":                  {kind: kindFeatureSetting, feature: featServices},
	"bgp_attach_ip_to_interface":     {kind: kindFeatureSetting, feature: featServices},
	"mirror_dest_interface":          {kind: kindFeatureSetting, feature: featServices},
	"iptables_backend":               {kind: kindFeatureSetting, feature: featEgress},
	"egress_podcidr":                 {kind: kindFeatureSetting, feature: featEgress},
	"egress_servicecidr":             {kind: kindFeatureSetting, feature: featEgress},
	"egress_withnftables":            {kind: kindFeatureSetting, feature: featEgress},
	"egress_enableinternalsnat":      {kind: kindFeatureSetting, feature: featEgress},
	"egress_clean":                   {kind: kindFeatureSetting, feature: featEgress},
	"EGRESS_CLEAN":                   {kind: kindFeatureSetting, feature: featEgress},
	"lb_port":                        {kind: kindFeatureSetting, feature: featLB},
	"lb_fwdmethod":                   {kind: kindFeatureSetting, feature: featLB},
	"backend_health_check_interval":  {kind: kindFeatureSetting, feature: featLB},
	"vip_routingtableid":             {kind: kindFeatureSetting, feature: featRT},
	"vip_routingtabletype":           {kind: kindFeatureSetting, feature: featRT},
	"vip_routingprotocol":            {kind: kindFeatureSetting, feature: featRT},
	"vip_cleanroutingtable":          {kind: kindFeatureSetting, feature: featRT},
	"zebra_url":                      {kind: kindFeatureSetting, feature: featZebra},
	"zebra_version":                  {kind: kindFeatureSetting, feature: featZebra},
	"zebra_software_name":            {kind: kindFeatureSetting, feature: featZebra},
	"dns_mode":                       {kind: kindFeatureSetting, feature: featDDNS, why: "only used when address is a DNS name"},
	"dhcp_mode":                      {kind: kindFeatureSetting, feature: featDDNS, why: "only used when address is a DNS name"},
	"dhcp_backoff_attempts":          {kind: kindFeatureSetting, feature: featDDNS},

	// Behaviour that differs in vipd, with no setting.
	"vip_preserve_on_leadership_loss":    {kind: kindChanged, why: "vipd always removes the VIP from a node that stops holding it"},
	"vip_loseleadership":                 {kind: kindChanged, why: "vipd has no link-down timer: a holder whose link is down stops answering gossip and another node takes over"},
	"vip_loseleadership_timeout_seconds": {kind: kindIrrelevant, why: "only used with vip_loseleadership"},
	"vip_skipdad":                        {kind: kindChanged, why: "vipd handles IPv6 DAD itself (nodad only when its own election is trusted, recovery from dadfailed)"},
	"vip_allow_interface_not_up":         {kind: kindChanged, why: "vipd binds the VIP on the configured interface whatever its state; the health check decides"},
	"vip_interfaceloglobal":              {kind: kindChanged, why: "in bgp mode vipd binds the VIP on lo itself and sets the scope"},
	"bgp_sourceif":                       {kind: kindChanged, why: "vipd lets the kernel pick the BGP session's source address (the route to the peer)"},
	"bgp_sourceip":                       {kind: kindChanged, why: "vipd lets the kernel pick the BGP session's source address (the route to the peer)"},
	"bgp_routerinterface":                {kind: kindChanged, why: "set VIPD_BGP_ROUTER_ID to that interface's IPv4 address on each node"},
	"mpbgp_nexthop":                      {kind: kindChanged, why: "MP-BGP next-hop policies are not supported: vipd advertises IPv4 and IPv6 VIPs with the session address as next hop"},
	"mpbgp_ipv4":                         {kind: kindChanged, why: "MP-BGP next-hop policies are not supported: vipd advertises IPv4 and IPv6 VIPs with the session address as next hop"},
	"mpbgp_ipv6":                         {kind: kindChanged, why: "MP-BGP next-hop policies are not supported: vipd advertises IPv4 and IPv6 VIPs with the session address as next hop"},
	"health_check_port":                  {kind: kindChanged, why: "vipd serves /healthz (which reflects its real state) on VIPD_METRICS_ADDRESS"},
	"config_file":                        {kind: kindChanged, why: "settings in kube-vip's config file were not read; migrate them by adding them to the input"},
	"annotation":                         {kind: kindChanged, why: "BGP settings kube-vip read from node annotations were not read; put them into VIPD_BGP_* on each node"},
	"vip_leaseannotations":               {kind: kindIrrelevant, why: "vipd uses no Kubernetes Lease"},

	// Irrelevant for vipd.
	"cp_namespace":    {kind: kindIrrelevant, why: "vipd uses no Kubernetes Lease"},
	"vip_leasename":   {kind: kindIrrelevant, why: "vipd uses no Kubernetes Lease"},
	"k8s_config_file": {kind: kindIrrelevant, why: "vipd needs no kubeconfig for the control-plane VIP"},
	"kubernetes_addr": {kind: kindIrrelevant, why: "vipd needs no kubeconfig for the control-plane VIP"},
	"instance_name":   {kind: kindIrrelevant, why: "only separated kube-vip instances' nftables tables"},
	"INSTANCE_NAME":   {kind: kindIrrelevant, why: "only separated kube-vip instances' nftables tables"},
}

// kubeVIPFlags maps kube-vip's command-line flags to the env names they
// set; bool flags take no separate value.
var kubeVIPFlags = map[string]struct {
	env    string
	isBool bool
}{
	"vip":                                   {env: "vip_address"},
	"address":                               {env: "address"},
	"vipSubnet":                             {env: "vip_subnet"},
	"port":                                  {env: "port"},
	"interface":                             {env: "vip_interface"},
	"serviceInterface":                      {env: "vip_servicesinterface"},
	"arp":                                   {env: "vip_arp", isBool: true},
	"bgp":                                   {env: "bgp_enable", isBool: true},
	"table":                                 {env: "vip_routingtable", isBool: true},
	"wireguard":                             {env: "vip_wireguard", isBool: true},
	"controlplane":                          {env: "cp_enable", isBool: true},
	"services":                              {env: "svc_enable", isBool: true},
	"leaderElection":                        {env: "vip_leaderelection", isBool: true},
	"leaseName":                             {env: "vip_leasename"},
	"leaseDuration":                         {env: "vip_leaseduration"},
	"leaseRenewDuration":                    {env: "vip_renewdeadline"},
	"leaseRetry":                            {env: "vip_retryperiod"},
	"namespace":                             {env: "cp_namespace"},
	"n":                                     {env: "cp_namespace"},
	"nodeName":                              {env: "vip_nodename"},
	"log":                                   {env: "vip_loglevel"},
	"prometheusHTTPServer":                  {env: "prometheus_server"},
	"localAS":                               {env: "bgp_as"},
	"bgpRouterID":                           {env: "bgp_routerid"},
	"peerAddress":                           {env: "bgp_peeraddress"},
	"peerAS":                                {env: "bgp_peeras"},
	"peerPass":                              {env: "bgp_peerpass"},
	"multihop":                              {env: "bgp_multihop", isBool: true},
	"bgppeers":                              {env: "bgp_peers"},
	"sourceIF":                              {env: "bgp_sourceif"},
	"sourceIP":                              {env: "bgp_sourceip"},
	"bgpHoldTimer":                          {env: "bgp_hold_time"},
	"bgpKeepAliveInterval":                  {env: "bgp_keepalive_interval"},
	"enableLoadBalancer":                    {env: "lb_enable", isBool: true},
	"lbPort":                                {env: "lb_port"},
	"lbForwardingMethod":                    {env: "lb_fwdmethod"},
	"k8sConfigPath":                         {env: "k8s_config_file"},
	"ddns":                                  {env: "vip_ddns", isBool: true},
	"dnsMode":                               {env: "dns_mode"},
	"dhcpMode":                              {env: "dhcp_mode"},
	"autodetectcp":                          {env: "cp_detect", isBool: true},
	"preserveVipOnLeadershipLoss":           {env: "vip_preserve_on_leadership_loss", isBool: true},
	"loseLeadership":                        {env: "vip_loseleadership", isBool: true},
	"enableNodeLabeling":                    {env: "enable_node_labeling", isBool: true},
	"healthCheckPort":                       {env: "health_check_port"},
	"instanceName":                          {env: "instance_name"},
	"config-file":                           {env: "config_file"},
	"debounceTime":                          {env: "debounce_time"},
	"zebra":                                 {env: "zebra_enable", isBool: true},
	"controlPlaneHealthCheckAddress":        {env: "control_plane_health_check_address"},
	"controlPlaneHealthCheckPeriodSeconds":  {env: "control_plane_health_check_period_seconds"},
	"controlPlaneHealthCheckTimeoutSeconds": {env: "control_plane_health_check_timeout_seconds"},
	"controlPlaneHealthCheckFailureThreshold": {env: "control_plane_health_check_failure_threshold"},
	"controlPlaneHealthCheckCAPath":           {env: "control_plane_health_check_ca_path"},
}
