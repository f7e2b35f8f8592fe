package sink

import (
	"net/http"
	"strings"

	"github.com/repeatrate/repeatrate/sink/auth"
)

// tokenCookie carries a token set by the login form, for pages read by a browser without
// JavaScript (which cannot send an Authorization header). HttpOnly and SameSite=Strict.
const tokenCookie = "repeatrate_token"

// principal is the request's token holder: from the Authorization header, else the login cookie;
// nil without a known token.
func (a *api) principal(req *http.Request) *auth.Principal {
	if tok := auth.Bearer(req); tok != "" {
		return a.cfg.Tokens.Lookup(tok)
	}
	if c, err := req.Cookie(tokenCookie); err == nil {
		return a.cfg.Tokens.Lookup(c.Value)
	}
	return nil
}

// allow answers 401 without a known token and 403 when the token may not read ws, and reports
// whether the request may go on. Both answers are the same whatever ws holds, or whether it
// exists: they tell nothing about other tenants.
func (a *api) allow(w http.ResponseWriter, req *http.Request, ws string, badge bool) bool {
	p := a.principal(req)
	if p == nil {
		a.metrics.denied.WithLabelValues("401").Inc()
		w.Header().Set("WWW-Authenticate", `Bearer realm="repeatrate"`)
		writeError(w, http.StatusUnauthorized, "a bearer token is required (Authorization: Bearer <token>)", badge)
		return false
	}
	if !p.Can(ws, auth.Read) {
		a.metrics.denied.WithLabelValues("403").Inc()
		writeError(w, http.StatusForbidden, "this token may not read the workspace", badge)
		return false
	}
	return true
}

// login sets the token cookie from a posted form and goes to the index; a wrong token answers
// 401 with the form again.
func (a *api) login(w http.ResponseWriter, req *http.Request) {
	if err := req.ParseForm(); err != nil {
		writeError(w, http.StatusBadRequest, "unreadable form", false)
		return
	}
	tok := strings.TrimSpace(req.PostForm.Get("token"))
	if a.cfg.Tokens.Lookup(tok) == nil {
		a.metrics.denied.WithLabelValues("401").Inc()
		a.renderPage(w, http.StatusUnauthorized, "login", pageData{Title: "Sign in", Error: "unknown token"})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: tok, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: req.TLS != nil, MaxAge: 12 * 3600})
	http.Redirect(w, req, "/", http.StatusSeeOther)
}

func (a *api) logout(w http.ResponseWriter, req *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: "", Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, MaxAge: -1})
	http.Redirect(w, req, "/login", http.StatusSeeOther)
}
