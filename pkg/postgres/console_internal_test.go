package postgres

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

// TestNotificationKindsListed: the console finds an event's notifications
// by the delivery ids of every kind, so a kind declared anywhere in this
// package or in pkg/ledger (which writes them) and missing from
// notificationKinds would hide its rows.
func TestNotificationKindsListed(t *testing.T) {
	declared := regexp.MustCompile(`(?m)^\s*Notify[A-Za-z]+\s*=\s*"([a-z_]+)"`)
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	ledgerFiles, err := filepath.Glob("../ledger/*.go")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, ledgerFiles...)
	found := 0
	for _, file := range files {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range declared.FindAllStringSubmatch(string(src), -1) {
			found++
			if !slices.Contains(notificationKinds, m[1]) {
				t.Errorf("%s declares notification kind %q, missing from notificationKinds", file, m[1])
			}
		}
	}
	if found < len(notificationKinds) {
		t.Fatalf("found %d kind declarations, fewer than the %d listed", found, len(notificationKinds))
	}
}
