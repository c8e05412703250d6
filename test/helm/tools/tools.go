//go:build tools

// Package tools pins the helm CLI that `make helm` builds for the chart's
// lint and template checks (a module of its own, so helm's dependency graph
// stays out of the plugin's go.mod).
package tools

import _ "helm.sh/helm/v3/cmd/helm"
