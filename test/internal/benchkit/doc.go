// Package benchkit is the machinery the benchmark commands under test/ share:
// re-executing in a private mount namespace (so libcni's result cache can be
// hidden under a temp directory), network namespaces bind-mounted at paths of
// our choice, building the plugins, processes started inside a namespace and
// killed on cleanup, iperf3's JSON, and the facts a results header records
// (kernel, commit, load average).
package benchkit
