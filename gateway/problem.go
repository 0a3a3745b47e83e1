package gateway

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"
)

// Problem is an RFC 9457 problem detail. It is a dozen lines, so it is
// written here rather than taken from a library: the maintained Go problem
// packages are either RFC 7807-era and unmaintained or pull in a framework.
type Problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
}

// problemBase prefixes the type URIs; they name documentation anchors.
const problemBase = "https://stockgate.dev/problems/"

// writeProblem answers with a problem+json body and aborts the handler chain.
// retryAfter > 0 sets Retry-After in seconds (429 and 503).
func writeProblem(c *gin.Context, status int, kind, detail string, retryAfter int) {
	if retryAfter > 0 {
		c.Header("Retry-After", strconv.Itoa(retryAfter))
	}
	c.Header("Cache-Control", "no-store")
	c.Render(status, problemRender{Problem{
		Type:     problemBase + kind,
		Title:    http.StatusText(status),
		Status:   status,
		Detail:   detail,
		Instance: c.Request.URL.Path,
	}})
	c.Abort()
}

type problemRender struct{ p Problem }

func (r problemRender) Render(w http.ResponseWriter) error {
	r.WriteContentType(w)
	return json.NewEncoder(w).Encode(r.p)
}

func (r problemRender) WriteContentType(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/problem+json")
}
