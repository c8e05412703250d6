// Command ebpf-agent is the ebpf-cni node agent and inspection CLI.
//
//	ebpf-agent run                     own the pinned datapath until stopped
//	ebpf-agent dump endpoints [-o json] print the endpoints map with counters
//	ebpf-agent dump hostports [-o json] print the hostPort mappings
//	ebpf-agent dump ct [-o json]        print translated hostPort flows and node sockets
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/cni"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

const usage = `usage:
  ebpf-agent run [--pin-dir DIR] [--hostports=true|false] [--cgroup-root DIR]
  ebpf-agent dump endpoints [--pin-dir DIR] [--state-dir DIR] [-o table|json]
  ebpf-agent dump hostports [--pin-dir DIR] [--state-dir DIR] [-o table|json]
  ebpf-agent dump ct [--pin-dir DIR] [-o table|json]
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = run(os.Args[2:])
	case "dump":
		err = dump(os.Args[2:])
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ebpf-agent:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	pinDir := fs.String("pin-dir", datapath.DefaultPinRoot, "bpffs directory of the datapath")
	hostPorts := fs.Bool("hostports", true, "own the node-level hostPort hooks (uplinks, cgroup socket hooks, node addresses)")
	cgroupRoot := fs.String("cgroup-root", "", "cgroup2 directory for the hostPort socket hooks (default: the cgroup2 mount)")
	fs.Parse(args)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var opts []agent.Option
	if *hostPorts {
		opts = append(opts, agent.WithHostPorts(*cgroupRoot))
	}
	return agent.Run(ctx, *pinDir, log.New(os.Stderr, "ebpf-agent: ", log.LstdFlags), opts...)
}

func dump(args []string) error {
	if len(args) < 1 {
		return fmt.Errorf("dump what? (endpoints, hostports, ct)")
	}
	what := args[0]
	fs := flag.NewFlagSet("dump", flag.ExitOnError)
	pinDir := fs.String("pin-dir", datapath.DefaultPinRoot, "bpffs directory of the datapath")
	stateDir := fs.String("state-dir", cni.DefaultStateDir, "plugin state directory (for container IDs and pod names)")
	format := fs.String("o", "table", "output format: table or json")
	fs.Parse(args[1:])
	switch what {
	case "endpoints":
		rows, err := agent.Endpoints(*pinDir, *stateDir)
		if err != nil {
			return err
		}
		return agent.WriteEndpoints(os.Stdout, rows, *format)
	case "hostports":
		rows, err := agent.HostPorts(*pinDir, *stateDir)
		if err != nil {
			return err
		}
		return agent.WriteHostPorts(os.Stdout, rows, *format)
	case "ct":
		d, err := agent.CT(*pinDir)
		if err != nil {
			return err
		}
		return agent.WriteCT(os.Stdout, d, *format)
	}
	return fmt.Errorf("unknown dump %q (want endpoints, hostports or ct)", what)
}
