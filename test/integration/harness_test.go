// Package integration drives the built ebpf-cni binary exactly as a runtime
// does (libcni: env + stdin JSON) inside network namespaces each test
// creates, and proves the datapath with real packets. One file per feature;
// the harness is test/testenv.
package integration

import (
	"os"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
