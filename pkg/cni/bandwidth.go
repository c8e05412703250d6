package cni

import "github.com/containernetworking/cni/pkg/types"

// validateBandwidth checks runtimeConfig.bandwidth.
func validateBandwidth(conf *NetConf) error {
	if conf.RuntimeConfig.Bandwidth != nil {
		return types.NewError(types.ErrUnsupportedField,
			"runtimeConfig.bandwidth: bandwidth limits are not built yet", "")
	}
	return nil
}
