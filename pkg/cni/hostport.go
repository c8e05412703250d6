package cni

import "github.com/containernetworking/cni/pkg/types"

// validateHostPorts checks runtimeConfig.portMappings.
func validateHostPorts(conf *NetConf) error {
	if len(conf.RuntimeConfig.PortMappings) > 0 {
		return types.NewError(types.ErrUnsupportedField,
			"runtimeConfig.portMappings: hostPort support is not built yet", "")
	}
	return nil
}
