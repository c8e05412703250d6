package ebpfcni

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// netlinkDumps are the vishvananda/netlink calls that dump (or may fall back
// to a dump) and so can fail with ErrDumpInterrupted when the kernel's table
// changes meanwhile: product code calls them through
// containernetworking/plugins/pkg/netlinksafe, which retries. ClassList has no
// netlinksafe twin. A call preceded by a "lint:raw-netlink-dump: why" comment
// is exempt (the node hooks' address dump must see an interruption as one).
var netlinkDumps = map[string]bool{
	"LinkList": true, "AddrList": true, "RouteList": true, "RouteListFiltered": true,
	"QdiscList": true, "FilterList": true, "RuleList": true, "RuleListFiltered": true,
	"LinkByName": true, "LinkGetProtinfo": true, "NeighList": true, "BridgeVlanList": true, "ClassList": true,
}

// TestNetlinkDumpsAreSafe is the lint rule of that: no product package
// (pkg/, cmd/, deploy/) calls a netlink dump directly.
func TestNetlinkDumpsAreSafe(t *testing.T) {
	fset := token.NewFileSet()
	for _, root := range []string{"pkg", "cmd", "deploy"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution|parser.ParseComments)
			if err != nil {
				return err
			}
			name := "" // the file's name for vishvananda/netlink
			for _, imp := range f.Imports {
				if strings.Trim(imp.Path.Value, `"`) == "github.com/vishvananda/netlink" {
					name = "netlink"
					if imp.Name != nil {
						name = imp.Name.Name
					}
				}
			}
			if name == "" {
				return nil
			}
			exempt := map[int]bool{} // lines right after a lint:raw-netlink-dump comment
			for _, cg := range f.Comments {
				if strings.Contains(cg.Text(), "lint:raw-netlink-dump:") {
					exempt[fset.Position(cg.End()).Line+1] = true
				}
			}
			ast.Inspect(f, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == name && netlinkDumps[sel.Sel.Name] && !exempt[fset.Position(sel.Pos()).Line] {
					t.Errorf("%s: netlink.%s: call netlinksafe.%s (retries an interrupted dump)", fset.Position(sel.Pos()), sel.Sel.Name, sel.Sel.Name)
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
