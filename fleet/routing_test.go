package fleet_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stockgate/stockgate/fleet"
	"github.com/stockgate/stockgate/ledger"
)

// routers are the routing rules a ledger call is sent by (fleet.go and
// calls.go); every call a Fleet forwards names one in its body.
var routers = map[string]string{
	"onSKU":        "the primary of the SKU's program (placed on a write that creates it)",
	"onProgram":    "the primary of the program",
	"writeProgram": "the primary of the program, placed when create, refused while it moves",
	"everywhere":   "every primary, the answers merged",
	"byID":         "the primary an id's row names (ids carry their program's hash)",
	"batchByID":    "each id's primary, one call per primary",
	"first":        "every primary in turn until one has the row (keys carry no program)",
	"byKey":        "a request's program's primary, or first when the caller names none",
	"fanOut":       "each take's program's primary, each primary's share in one call",
}

// ownRoutes are the Fleet methods that route by hand, and where to.
var ownRoutes = map[string]string{
	"Place":  "the directory, on the first primary",
	"ID":     "the fleet's own id",
	"Health": "every primary, each answering for itself",
	"Close":  "every primary",
}

// notForwarded are the *ledger.Ledger methods a Fleet does not offer, and
// why: their callers hold one primary's ledger (Fleet.Each, Fleet.Primary)
// because the call is about that primary itself.
var notForwarded = map[string]string{
	// The relay runs per primary: each primary's outbox, leases and dead
	// letters are its own.
	"Advance": "relay, per primary", "Bury": "relay, per primary", "ClaimPartitions": "relay, per primary",
	"DeadLetter": "relay, per primary", "DeadLetters": "relay, per primary", "ForgetDeadLetter": "relay, per primary",
	"PartitionEvents": "relay, per primary", "PartitionState": "relay, per primary",
	"PendingPartitions": "relay, per primary", "RecordFailure": "relay, per primary", "RelayStats": "relay, per primary",
	"ReleasePartitions": "relay, per primary", "SettledSeq": "relay, per primary",
	// A program's move and the directory: the Fleet's own machinery, which
	// names the primary it asks.
	"DropProgram": "move", "EndMoving": "move", "HasProgram": "move", "LiftTombstone": "move", "MarkMoving": "move",
	"LivesHere": "directory", "PlacementOf": "directory", "Placements": "directory", "ProgramOfRow": "directory",
	"Programs": "directory", "SetPlacement": "directory",
	// A schema is each primary's (cmd/stockgate migrate).
	"DownTo": "migrations, per primary", "Schema": "migrations, per primary",
}

// Every ledger call a replica may make has a stated routing rule: a Fleet
// method of the same name whose body sends it by one of the routers, or
// a reason above why it is asked of one primary. A new ledger method fails
// here until it is given one, so none is sent to the wrong primary.
func TestEveryLedgerCallHasARoutingRule(t *testing.T) {
	routes := fleetRoutes(t)
	lt, ft := reflect.TypeFor[*ledger.Ledger](), reflect.TypeFor[*fleet.Fleet]()
	for i := range lt.NumMethod() {
		name := lt.Method(i).Name
		_, forwarded := ft.MethodByName(name)
		why, local := notForwarded[name]
		switch {
		case local && forwarded:
			t.Errorf("ledger.%s is listed as not forwarded (%s), yet Fleet has it: take it off the list", name, why)
		case local:
		case !forwarded:
			t.Errorf("ledger.%s has no Fleet method and no reason in notForwarded: route it (calls.go) or say why not", name)
		case len(routes[name]) == 0 && ownRoutes[name] == "":
			t.Errorf("Fleet.%s names no router (%v): say where its rows live", name, slices.Sorted(maps.Keys(routers)))
		}
	}
	for name := range notForwarded {
		if _, ok := lt.MethodByName(name); !ok {
			t.Errorf("notForwarded names ledger.%s, which does not exist", name)
		}
	}
}

// fleetRoutes reads the fleet's source: for each method of *Fleet, the
// routers its body calls.
func fleetRoutes(t *testing.T) map[string][]string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	routes := map[string][]string{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || fd.Body == nil {
				continue
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				fun := call.Fun
				if ix, ok := fun.(*ast.IndexExpr); ok { // onSKU[T](...)
					fun = ix.X
				}
				if id, ok := fun.(*ast.Ident); ok && routers[id.Name] != "" {
					routes[fd.Name.Name] = append(routes[fd.Name.Name], id.Name)
				}
				return true
			})
		}
	}
	return routes
}
