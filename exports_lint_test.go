package ebpfcni

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// testOnlyExports are the exported identifiers of pkg/... that product code
// (pkg/, cmd/, deploy/ without their tests) does not use, by
// "importpath.Name" or "importpath.Type.Method". The list only shrinks: an
// export only tests use is product API nobody maintains for a user, so it
// gets a product user, or the tests read the same state through the API the
// product uses, or it moves to a test helper package (pkg/maps/mapstest).
var testOnlyExports = map[string]bool{}

// ifaceMethods are the method names a type may export to satisfy an
// interface of the standard library or a dependency (fmt.Stringer, error,
// json, sort, flag/pflag Value, Prometheus collectors, net/http): the calls
// are made through the interface, outside the module.
var ifaceMethods = map[string]bool{
	"String": true, "Error": true, "Unwrap": true, "Is": true, "As": true, "Format": true,
	"MarshalJSON": true, "UnmarshalJSON": true, "MarshalText": true, "UnmarshalText": true,
	"MarshalBinary": true, "UnmarshalBinary": true, "Len": true, "Less": true, "Swap": true,
	"Set": true, "Type": true, "Describe": true, "Collect": true, "ServeHTTP": true,
	"Read": true, "Write": true, "Close": true, "GoString": true, "Timeout": true, "Temporary": true,
}

// TestExportsHaveProductUsers is the lint rule of that: every exported
// function, method, type, variable and constant declared in pkg/ (generated
// files excepted) is used by product code, or is in testOnlyExports.
func TestExportsHaveProductUsers(t *testing.T) {
	unused, err := exportsWithoutProductUse()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, u := range unused {
		seen[u.key] = true
		if !testOnlyExports[u.key] {
			t.Errorf("%s: %s is exported but no product code uses it (tests only, or nobody): give it a product user, read the state through the product API in tests, or move it to a test helper package", u.pos, u.key)
		}
	}
	for key := range testOnlyExports {
		if !seen[key] {
			t.Errorf("%s is in testOnlyExports but product code uses it now (or it is gone): remove it from the list", key)
		}
	}
}

type unusedExport struct{ key, pos string }

type goPkg struct {
	path, dir string
	files     []string
}

// exportsWithoutProductUse type-checks the module's product packages (their
// imports from the compiler's export data, which `go list -export` builds)
// and lists the exported objects of pkg/... no product package refers to.
func exportsWithoutProductUse() ([]unusedExport, error) {
	out, err := exec.Command("go", "list", "-export", "-deps",
		"-f", "{{.ImportPath}}\t{{.Export}}\t{{.Module}}\t{{.Dir}}\t{{join .GoFiles \" \"}}",
		"./pkg/...", "./cmd/...", "./deploy/...").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		return nil, fmt.Errorf("go list -export: %w: %s", err, stderr)
	}
	const module = "github.com/ebpf-cni/ebpf-cni"
	export := map[string]string{}
	var own []goPkg
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 5 {
			continue
		}
		export[f[0]] = f[1]
		if strings.HasPrefix(f[2], module) && (f[0] == module || strings.HasPrefix(f[0], module+"/")) {
			if isTestHelper(f[0]) {
				continue // its uses are tests' uses; its exports are for tests
			}
			own = append(own, goPkg{path: f[0], dir: f[3], files: strings.Fields(f[4])})
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		if export[path] == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(export[path])
	})
	declared := map[string]string{} // key -> position
	used := map[string]bool{}
	ifaceUsed := map[string]bool{} // method names called through an interface
	for _, p := range own {
		var files []*ast.File
		for _, name := range p.files {
			f, err := parser.ParseFile(fset, filepath.Join(p.dir, name), nil, parser.ParseComments)
			if err != nil {
				return nil, err
			}
			files = append(files, f)
		}
		info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Defs: map[*ast.Ident]types.Object{}}
		conf := types.Config{Importer: imp.(types.ImporterFrom)}
		pkg, err := conf.Check(p.path, fset, files, info)
		if err != nil {
			return nil, fmt.Errorf("type-check %s: %w", p.path, err)
		}
		for _, imp := range pkg.Imports() {
			if isTestHelper(imp.Path()) {
				return nil, fmt.Errorf("%s imports %s, a package for tests only", p.path, imp.Path())
			}
		}
		for _, obj := range info.Uses {
			if k := objKey(obj); k != "" {
				used[k] = true
			}
			if fn, ok := obj.(*types.Func); ok {
				if sig, ok := fn.Type().(*types.Signature); ok && sig.Recv() != nil && types.IsInterface(sig.Recv().Type()) {
					ifaceUsed[fn.Name()] = true
				}
			}
		}
		if !strings.HasPrefix(p.path, module+"/pkg/") {
			continue
		}
		for _, f := range files {
			if ast.IsGenerated(f) {
				continue
			}
			for id, obj := range info.Defs {
				if obj == nil || !obj.Exported() || fset.File(id.Pos()) != fset.File(f.Pos()) {
					continue
				}
				if k := objKey(obj); k != "" {
					declared[k] = fset.Position(id.Pos()).String()
				}
			}
		}
	}
	var res []unusedExport
	for k, pos := range declared {
		if used[k] {
			continue
		}
		if i := strings.LastIndexByte(k, '.'); strings.Count(k[strings.LastIndexByte(k, '/'):], ".") == 2 {
			if m := k[i+1:]; ifaceMethods[m] || ifaceUsed[m] {
				continue
			}
		}
		rel, _ := filepath.Rel(mustGetwd(), pos)
		res = append(res, unusedExport{key: k, pos: rel})
	}
	sort.Slice(res, func(i, j int) bool { return res[i].pos < res[j].pos })
	return res, nil
}

// isTestHelper: a package for tests only by convention (pkg/maps/mapstest):
// its last element ends in "test".
func isTestHelper(path string) bool {
	return strings.HasSuffix(path[strings.LastIndexByte(path, '/')+1:], "test")
}

// objKey names a package-level object "path.Name" and a method of a named
// type "path.Type.Method"; struct fields, locals and interface methods get "".
func objKey(obj types.Object) string {
	if obj.Pkg() == nil {
		return ""
	}
	switch o := obj.(type) {
	case *types.Func:
		sig := o.Type().(*types.Signature)
		if sig.Recv() == nil {
			if o.Parent() != o.Pkg().Scope() {
				return ""
			}
			return o.Pkg().Path() + "." + o.Name()
		}
		rt := sig.Recv().Type()
		if p, ok := rt.(*types.Pointer); ok {
			rt = p.Elem()
		}
		named, ok := rt.(*types.Named)
		if !ok || types.IsInterface(named) || !named.Obj().Exported() {
			return ""
		}
		return o.Pkg().Path() + "." + named.Obj().Name() + "." + o.Name()
	case *types.TypeName, *types.Var, *types.Const:
		if obj.Parent() != obj.Pkg().Scope() {
			return ""
		}
		return obj.Pkg().Path() + "." + obj.Name()
	}
	return ""
}

func mustGetwd() string {
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	return wd
}
