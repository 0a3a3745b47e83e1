package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
)

// bodyDeadline bounds, by BodyTimeout, the read of a request's body by
// anyone: a refusal answered before the handler reads it (a 429, a 404, a
// sold-out answered at the door) has net/http read what is left of it
// once the handler is done (up to 256 KiB), and the server bounds only the
// headers' time, so a client that stopped sending held a goroutine and its
// socket as long as it liked. The deadline stays for that read (the
// server sets the next request's own); decodeBodyMax sets its own and
// clears it once the body is read, before net/http's background read
// starts (a deadline standing then would cancel the request's context).
func (s *Server) bodyDeadline(c *gin.Context) {
	if s.opts.BodyTimeout > 0 && c.Request.ContentLength != 0 {
		_ = http.NewResponseController(c.Writer).SetReadDeadline(time.Now().Add(s.opts.BodyTimeout)) // unsupported: unbounded, as before
	}
}

// decodeBody reads exactly one JSON object into v: unknown fields, trailing
// data and bodies over the limit are refused, each with its own status.
// It reports whether the handler may go on.
func (s *Server) decodeBody(c *gin.Context, v any) bool {
	return s.decodeBodyMax(c, v, s.opts.MaxBodyBytes)
}

// decodeOptionalBody is decodeBody for a route where no body at all means
// its defaults: an empty body, announced (Content-Length: 0) or not
// (chunked), leaves v as it is.
func (s *Server) decodeOptionalBody(c *gin.Context, v any) bool {
	if c.Request.ContentLength == 0 {
		return true
	}
	return s.decode(c, v, s.opts.MaxBodyBytes, true)
}

// noBody guards a route that takes no body: none, or an empty object,
// passes; anything else is refused as any route refuses it (415 another
// type, 413 over the limit, 400 a member it does not know), before the
// route acts. Unread, a text/xml body of 6 KB ended a sale (helper-110):
// a 4xx changes nothing, which a client can count on only if the 4xx
// comes.
func (s *Server) noBody(c *gin.Context) {
	if !s.decodeOptionalBody(c, &struct{}{}) {
		c.Abort()
	}
}

// decodeBodyMax is decodeBody with its own size limit (an admin seat map is
// larger than any buyer's request).
func (s *Server) decodeBodyMax(c *gin.Context, v any, maxBytes int64) bool {
	return s.decode(c, v, maxBytes, false)
}

// decode is decodeBodyMax; optional: an empty body leaves v as it is.
func (s *Server) decode(c *gin.Context, v any, maxBytes int64, optional bool) bool {
	if !bodyHeadersOK(c, maxBytes) {
		return false
	}
	// Read it whole first (it is small and bounded), so a body over the
	// limit is noticed even when its first bytes were a complete object;
	// within BodyTimeout (bodies are small: a client still sending past it
	// is stalled or hostile), so it holds no goroutine and socket longer.
	// The server bounds only the headers' time: a whole-request read
	// timeout would also cut the event streams, which read nothing after
	// their headers.
	rc := http.NewResponseController(c.Writer)
	if s.opts.BodyTimeout > 0 {
		_ = rc.SetReadDeadline(time.Now().Add(s.opts.BodyTimeout)) // unsupported (a test's recorder): unbounded, as before
	}
	raw, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, maxBytes))
	if err == nil && s.opts.BodyTimeout > 0 {
		_ = rc.SetReadDeadline(time.Time{}) // read whole: the handler may take its time
	}
	// A body not read whole is not read further: net/http would read what
	// is left of it (up to 256 KiB) before the answer or when it closes
	// the body, and with no deadline a stalled client holds it for good.
	// The connection ends with the answer.
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		_ = rc.SetReadDeadline(time.Now())
		c.Header("Connection", "close")
		writeProblem(c, http.StatusRequestEntityTooLarge, "body-too-large",
			fmt.Sprintf("request body over %d bytes", maxBytes), 0)
		return false
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		c.Header("Connection", "close") // the rest of the body would be read as the next request
		writeProblem(c, http.StatusRequestTimeout, "body-timeout",
			fmt.Sprintf("the request body did not arrive within %v", s.opts.BodyTimeout), 0)
		return false
	}
	if err == nil && optional && len(raw) == 0 {
		return true // no body: the route's defaults
	}
	if err == nil && bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		err = errors.New("null is not an object") // json would leave v as it was: {} by another name
	}
	if err == nil {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		err = dec.Decode(v)
		if err == nil {
			// One value only: anything after it is an error.
			if _, terr := dec.Token(); terr != io.EOF {
				err = errors.New("data after the JSON object")
			}
		}
	}
	if err == nil {
		err = duplicateMember(raw)
	}
	var typeErr *json.UnmarshalTypeError
	var timeErr *time.ParseError
	switch {
	case err == nil:
		return true
	case errors.As(err, &timeErr) || (err != nil && strings.HasPrefix(err.Error(), "Time.UnmarshalJSON")):
		// A time.Time field's own error names no field (json adds the
		// field only to its own type errors), and it is the client's
		// value that is wrong, not the JSON.
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field",
			"times are RFC 3339 strings, as 2026-12-06T18:00:00Z: "+err.Error(), 0)
	case errors.As(err, &typeErr) && typeErr.Field == "":
		writeProblem(c, http.StatusBadRequest, "malformed-json", "the body must be a JSON object", 0)
	case errors.As(err, &typeErr):
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field",
			fmt.Sprintf("field %q must be %s", typeErr.Field, kindOf(typeErr)), 0)
	default:
		writeProblem(c, http.StatusBadRequest, "malformed-json", "malformed JSON body: "+err.Error(), 0)
	}
	return false
}

// duplicateMember refuses an object with the same member name twice, at
// any depth: encoding/json keeps the last, so {"quantity":1,"quantity":5}
// would be read as 5 by us and as 1 by whoever checked it first. raw must
// be valid JSON (the decoder has accepted it): then a string is a member
// name exactly when a colon follows it. It scans bytes, allocation-light,
// because it runs on every request.
func duplicateMember(raw []byte) error {
	var stack [][]string // member names of each open object; nil for an array
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; c {
		case '{':
			stack = append(stack, make([]string, 0, 4))
		case '[':
			stack = append(stack, nil)
		case '}', ']':
			stack = stack[:len(stack)-1]
		case '"':
			start, plain := i, true
			for i++; raw[i] != '"'; i++ {
				if raw[i] == '\\' {
					i++
					plain = false
				} else if raw[i] >= 0x80 {
					plain = false
				}
			}
			j := i + 1
			for j < len(raw) && (raw[j] == ' ' || raw[j] == '\t' || raw[j] == '\n' || raw[j] == '\r') {
				j++
			}
			if j == len(raw) || raw[j] != ':' || len(stack) == 0 {
				continue // a value, not a member name
			}
			name := string(raw[start+1 : i])
			if !plain {
				if err := json.Unmarshal(raw[start:i+1], &name); err != nil {
					return err
				}
			}
			top := &stack[len(stack)-1]
			// strings.EqualFold folds as encoding/json matches names
			// (simple Unicode folding: K and the Kelvin sign, s and ſ).
			if slices.ContainsFunc(*top, func(seen string) bool { return strings.EqualFold(seen, name) }) {
				return fmt.Errorf("member %q appears twice (names are matched without regard to case)", raw[start+1:i])
			}
			*top = append(*top, name)
		}
	}
	return nil
}

func kindOf(e *json.UnmarshalTypeError) string {
	if e.Type != nil && strings.HasPrefix(e.Type.String(), "int") {
		return "an integer in range"
	}
	return e.Type.String()
}

// bodyHeadersOK refuses, from the headers alone, a body of another type or
// announced over the limit. It costs nothing, so it comes before any
// answer given without reading the body (a sold-out storm's 409).
func bodyHeadersOK(c *gin.Context, maxBytes int64) bool {
	ct := c.GetHeader("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); ct != "" && (err != nil || mt != "application/json") {
		c.Header("Connection", "close") // the body is not read: see bodyDeadline
		writeProblem(c, http.StatusUnsupportedMediaType, "unsupported-media-type", "send application/json", 0)
		return false
	}
	if c.Request.ContentLength > maxBytes {
		// Said up front (and before "100 Continue": net/http sends it at
		// the first read), so nothing is read of it, and the connection
		// ends with the answer (net/http would read the body first).
		c.Header("Connection", "close")
		writeProblem(c, http.StatusRequestEntityTooLarge, "body-too-large",
			fmt.Sprintf("request body over %d bytes", maxBytes), 0)
		return false
	}
	return true
}
