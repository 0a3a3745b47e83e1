package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode"

	"github.com/gin-gonic/gin"
)

// decodeBody reads exactly one JSON object into v: unknown fields, trailing
// data and bodies over the limit are refused, each with its own status.
// It reports whether the handler may go on.
func (s *Server) decodeBody(c *gin.Context, v any) bool {
	return s.decodeBodyMax(c, v, s.opts.MaxBodyBytes)
}

// decodeBodyMax is decodeBody with its own size limit (an admin seat map is
// larger than any buyer's request).
func (s *Server) decodeBodyMax(c *gin.Context, v any, maxBytes int64) bool {
	ct := c.GetHeader("Content-Type")
	if ct != "" && !strings.HasPrefix(ct, "application/json") {
		writeProblem(c, http.StatusUnsupportedMediaType, "unsupported-media-type", "send application/json", 0)
		return false
	}
	// Read it whole first (it is small and bounded), so a body over the
	// limit is noticed even when its first bytes were a complete object.
	raw, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, maxBytes))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		writeProblem(c, http.StatusRequestEntityTooLarge, "body-too-large",
			fmt.Sprintf("request body over %d bytes", maxBytes), 0)
		return false
	}
	if err == nil {
		err = duplicateMember(raw)
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
	var typeErr *json.UnmarshalTypeError
	switch {
	case err == nil:
		return true
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
// would be read as 5 by us and as 1 by whoever checked it first.
func duplicateMember(raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	type frame struct {
		object bool
		seen   map[string]bool
		key    bool // the next string token in this object is a member name
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				if top != nil && top.object {
					top.key = true // the object or array was a member's value
				}
				stack = append(stack, &frame{object: t == '{', seen: map[string]bool{}, key: t == '{'})
			default:
				stack = stack[:len(stack)-1]
			}
			continue
		case string:
			if top != nil && top.object && top.key {
				// encoding/json matches member names without regard to
				// case ("QUANTITY" sets quantity), so names that fold to
				// one are one member.
				f := foldName(t)
				if top.seen[f] {
					return fmt.Errorf("member %q appears twice (names are matched without regard to case)", t)
				}
				top.seen[f] = true
				top.key = false
				continue
			}
		}
		if top != nil && top.object {
			top.key = true // a scalar value: a member name comes next
		}
	}
}

// foldName maps every rune to the smallest of its Unicode case-folding
// orbit, so two names encoding/json would match map to one string (this
// covers its special cases too: the Kelvin sign and the long s).
func foldName(name string) string {
	b := make([]rune, 0, len(name))
	for _, r := range name {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b = append(b, least)
	}
	return string(b)
}

func kindOf(e *json.UnmarshalTypeError) string {
	if e.Type != nil && strings.HasPrefix(e.Type.String(), "int") {
		return "an integer in range"
	}
	return e.Type.String()
}
