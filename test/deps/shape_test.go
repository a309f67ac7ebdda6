package deps

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
	"strings"
	"testing"
)

// Limits on the shape of the daemon's types (docs/design.md §3): a type
// with more methods than maxMethods, or a struct holding a mutex with more
// fields than maxMutexFields, is a god object in the making (the
// predecessor's 76-method context object; issue 24's 55-method datastore).
// Split it by idea, each part with its own small surface.
const (
	maxMethods     = 25
	maxMutexFields = 15
)

// TestIpamdTypesStaySmall: no named type in ipamd/... has a method set
// (of *T, so pointer receivers and methods promoted through embedding count)
// larger than maxMethods, and no struct type there with a sync.Mutex or
// sync.RWMutex field has more than maxMutexFields fields. golangci-lint has
// no rule for either, so `make lint` runs this test.
func TestIpamdTypesStaySmall(t *testing.T) {
	for _, pkg := range typeCheck(t, module+"/ipamd/...") {
		for _, problem := range shapeProblems(pkg, module) {
			t.Error(problem)
		}
	}
}

// TestShapeProblemsFindsBigTypes checks the checker on a package written to
// break both limits, and on one within them.
func TestShapeProblemsFindsBigTypes(t *testing.T) {
	var big strings.Builder
	big.WriteString("package big\nimport \"sync\"\ntype inner struct{}\n")
	for i := range 20 {
		fmt.Fprintf(&big, "func (inner) In%d() {}\n", i)
	}
	// wide: 16 fields, one a mutex; its 6 own methods plus inner's 20
	// promoted ones make 26.
	big.WriteString("type wide struct {\n\tinner\n\tmu sync.RWMutex\n\ta, b, c, d, e, f, g, h, i, j, k, l, m int\n\tn string\n}\n")
	for i := range 6 {
		fmt.Fprintf(&big, "func (*wide) W%d() {}\n", i)
	}
	// fine: 15 fields with a mutex, 25 methods.
	big.WriteString("type fine struct {\n\tmu sync.Mutex\n\ta, b, c, d, e, f, g, h, i, j, k, l, m, n int\n}\n")
	for i := range 25 {
		fmt.Fprintf(&big, "func (fine) F%d() {}\n", i)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "big.go", big.String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	exports := exportData(t, "sync")
	pkg, err := (&types.Config{Importer: exportImporter(fset, exports)}).Check("big", fset, []*ast.File{f}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(shapeProblems(pkg, "big"), "\n")
	for _, want := range []string{"big.wide has 26 methods", "big.wide holds a mutex and has 16 fields"} {
		if !strings.Contains(got, want) {
			t.Errorf("problems lack %q; got:\n%s", want, got)
		}
	}
	if strings.Contains(got, "fine") || strings.Contains(got, "inner") {
		t.Errorf("types within the limits reported:\n%s", got)
	}
}

// shapeProblems lists pkg's types that break maxMethods or maxMutexFields;
// root is the module whose methods count (ownMethods).
func shapeProblems(pkg *types.Package, root string) []string {
	var out []string
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		tn, ok := scope.Lookup(name).(*types.TypeName)
		if !ok || tn.IsAlias() {
			continue
		}
		named, ok := tn.Type().(*types.Named)
		if !ok {
			continue
		}
		set := types.NewMethodSet(types.NewPointer(named))
		if _, isInterface := named.Underlying().(*types.Interface); isInterface {
			set = types.NewMethodSet(named)
		}
		if n := ownMethods(set, root); n > maxMethods {
			out = append(out, fmt.Sprintf("%s.%s has %d methods (at most %d): split it by idea", pkg.Name(), name, n, maxMethods))
		}
		st, ok := named.Underlying().(*types.Struct)
		if ok && holdsMutex(st) && st.NumFields() > maxMutexFields {
			out = append(out, fmt.Sprintf("%s.%s holds a mutex and has %d fields (at most %d): move what the lock does not guard, or a part with its own lock, out", pkg.Name(), name, st.NumFields(), maxMutexFields))
		}
	}
	return out
}

// ownMethods counts the methods of set declared in module root: a type's
// own, and those promoted from embedded types of the module. Methods
// promoted from other modules' types (a Kubernetes object's ObjectMeta, an
// embedded sync.Mutex) are theirs, not a surface the module designed.
func ownMethods(set *types.MethodSet, root string) int {
	n := 0
	for i := range set.Len() {
		if p := set.At(i).Obj().Pkg(); p != nil && (p.Path() == root || strings.HasPrefix(p.Path(), root+"/")) {
			n++
		}
	}
	return n
}

func holdsMutex(st *types.Struct) bool {
	for i := range st.NumFields() {
		if named, ok := st.Field(i).Type().(*types.Named); ok {
			obj := named.Obj()
			if obj.Pkg() != nil && obj.Pkg().Path() == "sync" && (obj.Name() == "Mutex" || obj.Name() == "RWMutex") {
				return true
			}
		}
	}
	return false
}

// typeCheck type-checks the non-test files of the packages pattern names,
// importing their dependencies from the compiler's export data (`go list
// -export`, from the build cache that `go vet` has just filled).
func typeCheck(t *testing.T, pattern string) []*types.Package {
	t.Helper()
	listed := exportData(t, pattern)
	fset := token.NewFileSet()
	imp := exportImporter(fset, listed)
	var pkgs []*types.Package
	for _, l := range listed {
		if l.depOnly {
			continue
		}
		var files []*ast.File
		for _, name := range l.goFiles {
			f, err := parser.ParseFile(fset, filepath.Join(l.dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		pkg, err := (&types.Config{Importer: imp}).Check(l.path, fset, files, nil)
		if err != nil {
			t.Fatalf("type-check %s: %v", l.path, err)
		}
		pkgs = append(pkgs, pkg)
	}
	if len(pkgs) < 5 {
		t.Fatalf("type-checked only %d packages under %s", len(pkgs), pattern)
	}
	return pkgs
}

// listedPackage is one package as `go list -export -deps` shows it.
type listedPackage struct {
	path, export, dir string
	goFiles           []string
	depOnly           bool // listed only as a dependency of the pattern's packages
}

// exportData lists pattern's packages and their dependencies, compiling
// them into the build cache as needed for their export data.
func exportData(t *testing.T, pattern string) []listedPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}\t{{.Dir}}\t{{join .GoFiles \" \"}}\t{{.DepOnly}}", pattern)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -export %s: %v\n%s", pattern, err, stderr.String())
	}
	var listed []listedPackage
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 5 {
			t.Fatalf("go list: unexpected line %q", sc.Text())
		}
		listed = append(listed, listedPackage{path: f[0], export: f[1], dir: f[2], goFiles: strings.Fields(f[3]), depOnly: f[4] == "true"})
	}
	return listed
}

// exportImporter imports packages from the export data exportData listed.
func exportImporter(fset *token.FileSet, listed []listedPackage) types.Importer {
	exports := map[string]string{}
	for _, l := range listed {
		exports[l.path] = l.export
	}
	return importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		if exports[path] == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(exports[path])
	})
}
