package ebpfcni

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// maxFuncLines is the longest a product function may be, counted from its
// func line to its closing brace: a longer one does several things and is
// split so that each part has a name.
const maxFuncLines = 80

// longFuncs are the product functions still over maxFuncLines, by
// "path:Func" (methods "path:Type.Method"). The list only shrinks: an entry
// that is short by now fails the test too, so it is removed.
var longFuncs = map[string]bool{}

// TestFunctionsAreShort is the lint rule of that: no function or method of
// pkg/ or cmd/ (generated files and tests excepted) is over maxFuncLines
// lines but those in longFuncs.
func TestFunctionsAreShort(t *testing.T) {
	long, err := funcsOver(maxFuncLines, "pkg", "cmd")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range long {
		seen[f.name] = true
		if !longFuncs[f.name] {
			t.Errorf("%s: %s is %d lines (at most %d: split it)", f.pos, f.fn, f.lines, maxFuncLines)
		}
	}
	for name := range longFuncs {
		if !seen[name] {
			t.Errorf("%s is in longFuncs but no longer over %d lines (or gone): remove it from the list", name, maxFuncLines)
		}
	}
}

type longFunc struct {
	name, fn, pos string // name is "path:fn"
	lines         int
}

// funcsOver lists the functions under roots longer than max lines, longest first.
func funcsOver(max int, roots ...string) ([]longFunc, error) {
	fset := token.NewFileSet()
	var out []longFunc
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution|parser.ParseComments)
			if err != nil {
				return err
			}
			if ast.IsGenerated(f) {
				return nil
			}
			for _, decl := range f.Decls {
				fd, ok := decl.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
				if n := end.Line - start.Line + 1; n > max {
					fn := funcName(fd)
					out = append(out, longFunc{name: path + ":" + fn, fn: fn, pos: start.String(), lines: n})
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].lines > out[j].lines })
	return out, nil
}

// funcName is Func, or Type.Method for a method.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	switch x := typ.(type) {
	case *ast.IndexExpr:
		typ = x.X
	case *ast.IndexListExpr:
		typ = x.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return fmt.Sprintf("%s.%s", id.Name, fd.Name.Name)
	}
	return fd.Name.Name
}
