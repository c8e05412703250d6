package cni

import (
	"context"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
)

// The IPAM plugin's verbs, delegated as the CNI library does. Not through
// plugins' pkg/ipam: it imports pkg/ip, which brings iptables and nftables
// helpers whose package initialisation (compiled regexps) every ADD and
// DEL paid for without using them (issue 30).

func ipamAdd(plugin string, conf []byte) (types.Result, error) {
	return invoke.DelegateAdd(context.TODO(), plugin, conf, nil)
}

func ipamDel(plugin string, conf []byte) error {
	return invoke.DelegateDel(context.TODO(), plugin, conf, nil)
}

func ipamCheck(plugin string, conf []byte) error {
	return invoke.DelegateCheck(context.TODO(), plugin, conf, nil)
}
