// Upgrading a node within map layout 3 to the build with the masquerade
// quota (issue 28): its maps (cni_masq_pods, cni_masq_quota, cni_masq_keys)
// are added to the pin set an older build of the layout left.

package integration

// preQuotaCommit is main before the masquerade quota (map layout 3 without
// its maps).
const preQuotaCommit = "a7659561026d66c6672e13ef911ddfff8f9ec644"
