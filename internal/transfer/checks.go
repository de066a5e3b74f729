package transfer

// check is one of the cores' checks, as a bit of a mask.
type check uint32

const (
	checkTenant       check = 1 << iota // every message names the reservation's tenant
	checkRequest                        // ... and its request
	checkEpoch                          // ... and its epoch
	checkLayout                         // the manifest's layout hash is the receiver's
	checkPageCount                      // pages announced == received == reserved
	checkFilled                         // per-page filled as the prompt implies, in manifest and pages
	checkTotalTokens                    // the manifest's tokens == the reserved prompt
	checkDigest                         // each page's bytes digest to the manifest's entry
	checkDuplicate                      // a second, different version of a page or manifest aborts
	checkLateWrite                      // nothing is written into a reservation that ended
	checkDrain                          // pages are released only once no writer is in flight (I7)
	checkPeer                           // only the reservation's parties may act on it
	checkSenderPrompt                   // sender: the prefill's prompt is the one the grant was for
)

// skipChecks disables checks, to show in tests that each one is what
// catches its bug (positive controls). Only _test.go files set it; it is
// zero in every binary.
var skipChecks check

func enabled(c check) bool { return skipChecks&c == 0 }
