package testenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"
)

// Chromium returns the path of a Chromium to drive, skipping the test when there is none (or
// failing under CI=true, as internal/testenv does for a missing service). deploy/local/test.sh
// installs Debian's chromium; REPEATRATE_TEST_CHROMIUM names another binary.
func Chromium(t testing.TB) string {
	t.Helper()
	names := []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"}
	if p := os.Getenv("REPEATRATE_TEST_CHROMIUM"); p != "" {
		names = []string{p}
	}
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("Chromium is required under CI=true but none of %v is on PATH (apt-get install chromium)", names)
	}
	t.Skipf("no Chromium (%v) on PATH: apt-get install chromium, or run deploy/local/test.sh", names)
	return ""
}

// ArtifactDir is where a test leaves what it shows a person (screenshots): REPEATRATE_TEST_ARTIFACTS/name,
// or test-artifacts/name at the repository's root (git-ignored). It is emptied first.
func ArtifactDir(t testing.TB, name string) string {
	t.Helper()
	dir := os.Getenv("REPEATRATE_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(repoRoot(t), "test-artifacts")
	}
	dir, err := filepath.Abs(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// repoRoot is the directory of the module's go.mod, above the test's working directory.
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

// PythonVenv returns the Python of the test venv (test/pyenv.sh makes it at .cache/venv;
// REPEATRATE_TEST_VENV names another), skipping the test without it, except under CI=true where
// it must exist.
func PythonVenv(t testing.TB) string {
	t.Helper()
	venv := os.Getenv("REPEATRATE_TEST_VENV")
	if venv == "" {
		venv = filepath.Join(repoRoot(t), ".cache", "venv")
	}
	py := filepath.Join(venv, "bin", "python")
	if _, err := os.Stat(py); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no Python venv at %s (test/pyenv.sh makes it): %v", venv, err)
		}
		t.Skipf("no Python venv at %s; run test/pyenv.sh", venv)
	}
	return py
}

// Browser starts a headless Chromium (Chromium) with a w×h window for the test and returns the
// chromedp context that drives it; the browser stops when ctx ends or the test does.
func Browser(t testing.TB, ctx context.Context, w, h int) context.Context {
	t.Helper()
	actx, acancel := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(Chromium(t)), chromedp.NoSandbox, chromedp.WindowSize(w, h),
		chromedp.Flag("disable-dev-shm-usage", true))...)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		bcancel()
		acancel()
	})
	return bctx
}

// Screenshot saves a full-page screenshot of what bctx shows as dir/file.
func Screenshot(t testing.TB, bctx context.Context, dir, file string) {
	t.Helper()
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", file, err)
	}
	if err := os.WriteFile(filepath.Join(dir, file), png, 0o644); err != nil {
		t.Fatal(err)
	}
}
