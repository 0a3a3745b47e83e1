package loadgen

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

var jsonHeader = http.Header{"Content-Type": []string{"application/json"}}

func keyed(prefix string, i uint64) http.Header {
	h := jsonHeader.Clone()
	h.Set("Idempotency-Key", prefix+strconv.FormatUint(i, 10))
	return h
}

// Purchases buys one ticket per request with a fresh Idempotency-Key
// (prefix + i) and buyer, spread round-robin over the SKUs
// ("program/ticket"); n > 0 stops after n requests.
func Purchases(skus []string, prefix string, n uint64) Scenario {
	return func(i uint64) (Request, bool) {
		if n > 0 && i >= n {
			return Request{}, false
		}
		return Request{Method: http.MethodPost, Path: "/v1/skus/" + skus[i%uint64(len(skus))] + "/purchases",
			Body: fmt.Sprintf(`{"buyer":"%sb%d","quantity":1}`, prefix, i), Header: keyed(prefix, i)}, true
	}
}

// Carts buys a cart per request: one ticket of each of tickets, all of
// program, with a fresh Idempotency-Key (prefix + i) and buyer (prefix +
// "b" + i), as Purchases does; n > 0 stops after n requests.
func Carts(program string, tickets []string, prefix string, n uint64) Scenario {
	var lines strings.Builder
	for j, t := range tickets {
		if j > 0 {
			lines.WriteByte(',')
		}
		fmt.Fprintf(&lines, `{"ticket":%q,"quantity":1}`, t)
	}
	path := "/v1/programs/" + program + "/carts"
	return func(i uint64) (Request, bool) {
		if n > 0 && i >= n {
			return Request{}, false
		}
		return Request{Method: http.MethodPost, Path: path,
			Body: fmt.Sprintf(`{"buyer":"%sb%d","lines":[%s]}`, prefix, i, lines.String()), Header: keyed(prefix, i)}, true
	}
}

// Reads asks for a SKU's remaining stock; n > 0 stops after n requests.
func Reads(sku string, n uint64) Scenario {
	return func(i uint64) (Request, bool) {
		if n > 0 && i >= n {
			return Request{}, false
		}
		return Request{Method: http.MethodGet, Path: "/v1/skus/" + sku + "/stock"}, true
	}
}

// Holds takes a hold of one ticket per request; n > 0 stops after n.
func Holds(sku, prefix string, n uint64) Scenario {
	return func(i uint64) (Request, bool) {
		if n > 0 && i >= n {
			return Request{}, false
		}
		return Request{Method: http.MethodPost, Path: "/v1/skus/" + sku + "/holds",
			Body: fmt.Sprintf(`{"buyer":"%sb%d","quantity":1}`, prefix, i), Header: keyed(prefix, i)}, true
	}
}

// Confirms confirms the given holds, each by its buyer (prefix + "b" + the
// index the hold was taken with).
func Confirms(holds []HoldRef, prefix string) Scenario {
	return func(i uint64) (Request, bool) {
		if i >= uint64(len(holds)) {
			return Request{}, false
		}
		h := holds[i]
		return Request{Method: http.MethodPost, Path: "/v1/holds/" + h.ID + "/confirm",
			Body: fmt.Sprintf(`{"buyer":%q}`, h.Buyer), Header: keyed(prefix+"c", i)}, true
	}
}

// Cancels cancels the given holds, each by its buyer.
func Cancels(holds []HoldRef, prefix string) Scenario {
	return func(i uint64) (Request, bool) {
		if i >= uint64(len(holds)) {
			return Request{}, false
		}
		h := holds[i]
		return Request{Method: http.MethodPost, Path: "/v1/holds/" + h.ID + "/cancel",
			Body: fmt.Sprintf(`{"buyer":%q}`, h.Buyer), Header: keyed(prefix+"x", i)}, true
	}
}

// HoldRef is a hold the holds scenario got.
type HoldRef struct{ ID, Buyer string }

// QueueJoins joins program's waiting room, one new buyer (prefix + "b" +
// i) per request; n > 0 stops after n requests.
func QueueJoins(program, prefix string, n uint64) Scenario {
	path := "/v1/programs/" + program + "/queue"
	return func(i uint64) (Request, bool) {
		if n > 0 && i >= n {
			return Request{}, false
		}
		return Request{Method: http.MethodPost, Path: path, Body: fmt.Sprintf(`{"buyer":"%sb%d"}`, prefix, i), Header: jsonHeader}, true
	}
}

// QueuePolls checks the given queue tickets of program, round-robin (a
// waiting buyer asking where it stands); n > 0 stops after n requests.
func QueuePolls(program string, tickets []string, n uint64) Scenario {
	return func(i uint64) (Request, bool) {
		if n > 0 && i >= n {
			return Request{}, false
		}
		return Request{Method: http.MethodGet, Path: "/v1/programs/" + program + "/queue/" + tickets[i%uint64(len(tickets))]}, true
	}
}
