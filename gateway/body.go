package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

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
	body := http.MaxBytesReader(c.Writer, c.Request.Body, maxBytes)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		// One value only: anything after it, even within the limit, is an error.
		var tooBig *http.MaxBytesError
		switch _, terr := dec.Token(); {
		case errors.As(terr, &tooBig):
			err = terr
		case terr != io.EOF:
			err = errors.New("data after the JSON object")
		}
	}
	if err == nil {
		// Read to the end so a body over the limit is noticed even when its
		// first bytes were a complete object.
		_, err = io.Copy(io.Discard, body)
	}
	var tooBig *http.MaxBytesError
	var typeErr *json.UnmarshalTypeError
	switch {
	case err == nil:
		return true
	case errors.As(err, &tooBig):
		writeProblem(c, http.StatusRequestEntityTooLarge, "body-too-large",
			fmt.Sprintf("request body over %d bytes", s.opts.MaxBodyBytes), 0)
	case errors.As(err, &typeErr):
		writeProblem(c, http.StatusUnprocessableEntity, "invalid-field",
			fmt.Sprintf("field %q must be %s", typeErr.Field, kindOf(typeErr)), 0)
	default:
		writeProblem(c, http.StatusBadRequest, "malformed-json", "malformed JSON body: "+err.Error(), 0)
	}
	return false
}

func kindOf(e *json.UnmarshalTypeError) string {
	if e.Type != nil && strings.HasPrefix(e.Type.String(), "int") {
		return "an integer in range"
	}
	return e.Type.String()
}
