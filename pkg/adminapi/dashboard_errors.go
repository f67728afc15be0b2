package adminapi

import (
	"bytes"
	"mime"
	"net/http"
	"strings"
	"unicode"

	"github.com/settle/settle/pkg/httpapi"
	"github.com/settle/settle/pkg/logging"
)

// dashboardErrorTextMax bounds what is kept of an error text of asynqmon:
// enough for its one-line messages, never a whole body held in memory.
const dashboardErrorTextMax = 512

// asynqNotFound starts the text of asynq's NOT_FOUND errors (an unknown
// queue, task or group), which asynqmon answers as a 500.
const asynqNotFound = "NOT_FOUND"

// jsonErrors answers asynqmon's errors, plain text from http.Error, in
// the API's JSON error shape, so that every error of the api is one
// shape. Its successes (HTML, scripts, JSON) and JSON errors pass as
// they are. Their text goes through redact: asynqmon's Metrics tab quotes
// the whole Prometheus URL it failed to query.
func jsonErrors(next http.Handler, redact *logging.Redactor) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ew := &errorWriter{ResponseWriter: w}
		next.ServeHTTP(ew, r)
		if !ew.replacing {
			return
		}
		status, text := ew.status, redact.String(strings.TrimSpace(ew.text.String()))
		message := text
		switch {
		case status == http.StatusInternalServerError && strings.Contains(text, asynqNotFound):
			status, message = http.StatusNotFound, "not found"
		case status >= http.StatusInternalServerError:
			// Its text may name Redis or internals: logged, not shown.
			logging.From(r.Context()).Warn().Int("status", status).Str("cause", text).Msg("queue dashboard error")
			message = "queue dashboard error"
		case message == "" || !printableText(message):
			message = strings.ToLower(http.StatusText(status))
		}
		// nosniff stays: dashboardHeaders sets it on every answer.
		for _, name := range []string{"Content-Type", "Content-Length"} {
			w.Header().Del(name)
		}
		httpapi.WriteError(w, r, status, message)
	})
}

// errorWriter holds back an error answer that is not JSON, keeping the
// start of its text, for jsonErrors to answer instead.
type errorWriter struct {
	http.ResponseWriter
	wrote     bool
	replacing bool
	status    int
	text      bytes.Buffer
}

func (w *errorWriter) WriteHeader(status int) {
	if w.wrote {
		return
	}
	w.wrote = true
	if status >= http.StatusBadRequest && !isJSON(w.Header().Get("Content-Type")) {
		w.replacing, w.status = true, status
		return
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *errorWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if !w.replacing {
		return w.ResponseWriter.Write(b)
	}
	if room := dashboardErrorTextMax - w.text.Len(); room > 0 {
		w.text.Write(b[:min(len(b), room)])
	}
	return len(b), nil
}

// Flush passes a flush on unless the answer is held back.
func (w *errorWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok && !w.replacing {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *errorWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func isJSON(contentType string) bool {
	media, _, err := mime.ParseMediaType(contentType)
	return err == nil && media == "application/json"
}

func printableText(s string) bool {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}
