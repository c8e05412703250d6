package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/connectivity"
	"github.com/ebpf-cni/ebpf-cni/pkg/nodes"
)

type connOpts struct {
	namespace, image, external string
	hostPort                   int
	policy, keep               bool
	timeout                    time.Duration
}

var conn connOpts

func connectivityFlags(fs *flag.FlagSet, o *opts) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster (default $KUBECONFIG, else the in-cluster service account)")
	fs.StringVar(&conn.namespace, "namespace", "ebpf-cni-connectivity", "namespace the check makes and deletes")
	fs.StringVar(&conn.image, "image", "registry.k8s.io/e2e-test-images/agnhost:2.56", "agnhost image the nodes have or can pull (servers: netexec; probes: connect)")
	fs.IntVar(&conn.hostPort, "host-port", 32180, "hostPort of the server pods")
	fs.StringVar(&conn.external, "external", "", "host:port outside the cluster for the egress check (default: the API server's endpoint)")
	fs.BoolVar(&conn.policy, "policy", false, "also check NetworkPolicy deny and allow")
	fs.DurationVar(&conn.timeout, "timeout", 5*time.Second, "one probe's connect timeout")
	fs.BoolVar(&conn.keep, "keep", false, "keep the namespace and its pods afterwards")
}

func runConnectivity(o *opts) error {
	if conn.hostPort < 1 || conn.hostPort > 65535 {
		return fmt.Errorf("connectivity: --host-port %d is out of range (1-65535)", conn.hostPort)
	}
	cfg, err := nodes.Config(o.kubeconfig)
	if err != nil {
		return fmt.Errorf("connectivity: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	lg := log.New(os.Stderr, "ebpf-agent connectivity: ", 0)
	rs, err := connectivity.Run(ctx, connectivity.Options{
		Config: cfg, Namespace: conn.namespace, Image: conn.image, HostPort: int32(conn.hostPort),
		External: conn.external, Policy: conn.policy, Timeout: conn.timeout, Keep: conn.keep, Logf: lg.Printf,
	})
	r := connectivity.NewReport(rs)
	if werr := inspect.Write(os.Stdout, r, o.format); werr != nil {
		return werr
	}
	if err != nil {
		return fmt.Errorf("connectivity: %w", err)
	}
	if r.Failed > 0 {
		return errors.New("connectivity: some paths failed")
	}
	return nil
}
