package endpoint

import (
	"fmt"
	"io"
	"os"
)

// warnOut receives what a verb warns of without failing: the plugin's
// stderr, which libcni copies to the runtime's own stderr after a
// successful verb (containerd and CRI-O keep it in their log; cnitool
// prints it).
var warnOut io.Writer = os.Stderr

// warnf writes one warning line.
func warnf(format string, args ...any) {
	fmt.Fprintf(warnOut, "ebpf-cni: warning: "+format+"\n", args...)
}
