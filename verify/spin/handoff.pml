/*
 * handoff.pml: a SPIN model of a disaggregated request's life at
 * pagewarden's gateway, prefill node and decode node: the lifecycle
 * (sched.Lifecycle), the KV handoff (transfer.Sender, transfer.Receiver and
 * their drivers in disagg) and the decode node's pages (kvcache.Pool), over
 * a network that loses, duplicates and reorders messages, with aborts at
 * every step. docs/spin.md maps every variable and transition to the Go
 * code; verify/spin/spin_test.go runs it in CI.
 *
 * Bounds: request A, a 3-token prompt in pages of 2 positions (2 pages,
 * filled 2 and 1), handed off from prefill to decode; a decode pool of 3
 * pages; at most CAPD/CAPP/CAPG (4/2/3) messages in flight to decode,
 * prefill and the gateway, a message sent into a full inbox being lost;
 * any message in flight may arrive next (reordering); one epoch (the
 * gateway tries each decode node once, and the model has one). Options:
 *   LOCAL_TENANT  a second tenant's request L runs on the decode node
 *                 itself and takes the pages A gives back;
 *   TWO_REQUESTS  a second handed-off request B (2-token prompt, 1 page)
 *                 of another tenant, over the same network and pool: the
 *                 pages one gives back are the other's next. Both are
 *                 submitted at the start (decode may take either Generate
 *                 at any step). Every abort of both at once is beyond a CI
 *                 run, so these take some of a request's behaviours away:
 *     A_NO_CLIENT_ABORT, B_NO_CLIENT_ABORT  its client never leaves;
 *     A_NO_LEASE_EXPIRY, B_NO_LEASE_EXPIRY  its lease never expires;
 *     A_CORRECT_PREFILL, B_CORRECT_PREFILL  its prefill computes the
 *                 granted prompt (no placeholder, no failure);
 *     A_PLAIN, B_PLAIN  all three;
 *   MAXLOSS=n, MAXDUP=n  messages the network loses or duplicates (0);
 *   RETRY=n       re-sends of an unacknowledged Abort per party (0);
 *   ASYNC_WRITES  page copies land after PageArrived returns (the core's
 *                 general contract; disagg's driver copies at once), so
 *                 drains and fences are reachable;
 *   LIVENESS      the LTL property pages_settle (pan -a; not -f, see
 *                 docs/spin.md);
 *   FOREIGN_ONLY  assert only the cross-tenant property at attention (no
 *                 position read holds another request's bytes), so that
 *                 a counterexample goes on to the read itself.
 * verify/spin/spin_test.go runs the combinations CI checks.
 *
 * Variants (spin -D...):
 *   BROKEN_INCIDENT       the incident: decode takes the reservation's word
 *                         for the prompt and pages are reused unscrubbed
 *                         (NO_MANIFEST_CHECKS + TRUST_RESERVATION +
 *                         NO_POOL_COMMIT_CHECK + NO_SCRUB).
 *   NO_SCRUB              kvcache.freePage leaves a page's bytes in place
 *                         (the incident's engine: "pages are not zeroed
 *                         before reuse").
 *   NO_MANIFEST_CHECKS    transfer.DisableManifestChecks: the receiver skips
 *                         the layout, page-count, filled, total and digest
 *                         checks.
 *   TRUST_RESERVATION     sched.CommitImport takes the token count from the
 *                         reservation, not from the handoff (sched mutant).
 *   NO_POOL_COMMIT_CHECK  kvcache.CommitImport skips its page-count and
 *                         per-page fill check (kvcache skipHandoffCheck).
 *   NO_DRAIN              the receiver releases an aborted reservation's
 *                         pages with writers in flight (checkDrain off).
 */

#ifdef BROKEN_INCIDENT
#define NO_MANIFEST_CHECKS
#define TRUST_RESERVATION
#define NO_POOL_COMMIT_CHECK
#define NO_SCRUB
#endif
#ifdef A_PLAIN
#define A_NO_CLIENT_ABORT
#define A_NO_LEASE_EXPIRY
#define A_CORRECT_PREFILL
#endif
#ifdef B_PLAIN
#define B_NO_CLIENT_ABORT
#define B_NO_LEASE_EXPIRY
#define B_CORRECT_PREFILL
#endif

#define NR 2          /* requests: 0 = A, 1 = B */
#define NP 3          /* decode pool pages */
#define PS 2          /* positions per page */
/* Messages in flight to decode, prefill and the gateway. Decode's inbox
 * holds a whole handoff (2 pages, the manifest and the commit leave
 * prefill in one step). */
#ifndef CAPD
#define CAPD 4
#endif
#ifndef CAPP
#define CAPP 2
#endif
#ifndef CAPG
#define CAPG 3
#endif
#ifndef MAXLOSS
#define MAXLOSS 0     /* injected losses (besides full inboxes) */
#endif
#ifndef MAXDUP
#define MAXDUP 0      /* injected duplicates */
#endif
#ifndef RETRY
#define RETRY 0       /* re-sends of an unacknowledged Abort per party */
#endif

/* The requests. */
#define PROMPT(r) ((r) == 0 -> 3 : 2)
#define NPG(r) ((PROMPT(r) + PS - 1) / PS)
#define CLAMP(x) ((x) < 0 -> 0 : ((x) > PS -> PS : (x)))
#define EXPFILL(tokens, i) CLAMP((tokens) - (i) * PS)
#define IX(r, i) ((r) * 2 + (i))

/* A manifest's variant: what prefill computed. FULL is the granted prompt;
 * SHORT is the incident's 1-token placeholder (one page of one position). */
#define MFULL 0
#define MSHORT 1
#define MPAGES(r, v) ((v) == MFULL -> NPG(r) : 1)
#define MTOTAL(r, v) ((v) == MFULL -> PROMPT(r) : 1)
#define MFILL(r, v, i) ((v) == MFULL -> EXPFILL(PROMPT(r), i) : ((i) == 0 -> 1 : 0))

/* ---- The network: one bag of counters per destination ----
 * A message is (kind, request, variant), coded (k*NR + r)*NV + v. A bag
 * is canonical (no order), so any message in it can be received next:
 * reordering. Sending into a full inbox loses the message. */
#define NV 4
#define LOST 255      /* no message: lost on the way */
#define CODE(k, r, v) (((k) * NR + (r)) * NV + (v))

/* decode's inbox */
#define DK_GEN 0      /* transfer.Generate (Reserve + job), gateway -> decode */
#define DK_PAGE 1     /* transfer.Page, v = index*2 + filled-1 */
#define DK_MAN 2      /* transfer.Manifest, v = MFULL | MSHORT */
#define DK_COMMIT 3   /* transfer.Commit */
#define DK_ABORT 4    /* transfer.Abort, v = FROM_GW | FROM_PF */
#define DK_ACK 5      /* transfer.AbortAck, v = FROM_GW | FROM_PF */
#define ND (6 * NR * NV)
/* prefill's inbox */
#define PK_PREFILL 0  /* transfer.Prefill (Grant + job), gateway -> prefill */
#define PK_ABORT 1    /* v = FROM_GW | FROM_DEC */
#define PK_ACK 2
#define NPF (3 * NR * NV)
/* gateway's inbox */
#define GK_GRANT 0
#define GK_COMMITTED 1
#define GK_RESULT 2   /* v = RES_OK | RES_OVER | RES_ERR */
#define GK_ABORT 3    /* v = FROM_DEC | FROM_PF */
#define GK_ACK 4
#define NG (5 * NR * NV)

#define FROM_GW 0
#define FROM_PF 1
#define FROM_DEC 1    /* in prefill's inbox: 0 gateway, 1 decode */
#define GFROM_DEC 0   /* in the gateway's inbox: 0 decode, 1 prefill */
#define GFROM_PF 1
#define NOBODY 2

#define RES_OK 0
#define RES_OVER 1
#define RES_ERR 2

byte netD[ND]; byte netP[NPF]; byte netG[NG];
byte cntD, cntP, cntG;
byte nloss, ndup;

inline sendD(k, r, v) {
  if
  :: cntD < CAPD -> netD[CODE(k, r, v)]++; cntD++
  :: cntD >= CAPD   /* inbox full: lost */
  fi
}
inline sendP(k, r, v) {
  if
  :: cntP < CAPP -> netP[CODE(k, r, v)]++; cntP++
  :: cntP >= CAPP
  fi
}
inline sendG(k, r, v) {
  if
  :: cntG < CAPG -> netG[CODE(k, r, v)]++; cntG++
  :: cntG >= CAPG
  fi
}

/* pick chooses any message in a bag (one transition per choice): any
 * message in flight can be the next one received, whatever the order it
 * was sent in. */
#define OPT(net, c, i) :: net[i] > 0 -> c = i
#define OPT4(net, c, i) OPT(net, c, i) OPT(net, c, i + 1) OPT(net, c, i + 2) OPT(net, c, i + 3)
#define OPT8(net, c, i) OPT4(net, c, i) OPT4(net, c, i + 4)
#define OPT16(net, c, i) OPT8(net, c, i) OPT8(net, c, i + 8)
#define pickD(c) if OPT16(netD, c, 0) OPT16(netD, c, 16) OPT16(netD, c, 32) fi
#define pickP(c) if OPT16(netP, c, 0) OPT8(netP, c, 16) fi
#define pickG(c) if OPT16(netG, c, 0) OPT16(netG, c, 16) OPT8(netG, c, 32) fi

/* ---- Decode node: kvcache.Pool (ledger plus ghost contents) ---- */
#define P_FREE 0
#define P_OWNED 1
#define P_QUAR 2
byte pst[NP];     /* ledger state */
byte pown[NP];    /* owner: request+1, 0 none */
byte pep[NP];     /* allocation epoch (unique over the pool's life) */
byte pfill[NP];   /* ledger filled: positions written, as committed */
byte nepoch;
/* Ghosts, not in the code: whose bytes the page holds (request+1 and the
 * allocation epoch it held the page under; 0 after a scrub), how many
 * positions, and whether a copy into it is in flight. */
byte wown[NP]; byte wep[NP]; byte wfill[NP];
/* wprev: whose bytes the positions at and after wfill still hold (0: none,
 * zeros): a write of fewer positions than a page leaves the rest as they
 * were, which after a scrub is nothing and without one (NO_SCRUB, the
 * incident's engine) is the previous owner's KV. */
byte wprev[NP];
bit pwr[NP];

/* ---- Decode node: sched.Core's requests (lifecycle and sequence) ---- */
#define S_NONE 0
#define S_PREFILL 1   /* StatePrefilling, awaitingImport */
#define S_DECODING 2
#define S_FINISHED 3
#define S_REJECTED 4
#define S_ABORTED 5
#define TERMINAL(s) ((s) >= S_FINISHED)
byte sst[NR];
bit sseq[NR];        /* holds a kvcache.Sequence */
byte stab[NR * 2];   /* block table: page index */
byte sep[NR * 2];    /* block table: the epoch the page was allocated under */
byte simp[NR * 2];   /* Sequence.imported: filled per logical page */
byte slen[NR];       /* Sequence.length */

/* ---- Decode node: transfer.Receiver (one reservation per request) ---- */
#define R_NONE 0
#define R_RECV 1
#define R_DRAIN 2
#define R_ENDED 3
#define O_NONE 0
#define O_COMMITTED 1
#define O_ABORTED 2
#define O_REAPED 3
byte rph[NR]; byte rout[NR]; bit rdrained[NR];
bit sarr[NR * 2]; byte sfill[NR * 2]; byte swr[NR * 2]; bit sfen[NR * 2];
byte rrecv[NR]; byte rwriting[NR];
byte rman[NR];       /* 0 none, else the manifest variant + 1 */
bit rcommit[NR];
bit rackGw[NR]; bit rackPf[NR];   /* ackTo */
bit rawGw[NR]; bit rawPf[NR];     /* awaitAck */
byte rretry[NR];
/* the decode driver (disagg.Decode) */
bit dbyow[NR]; bit dsettled[NR]; bit dresult[NR];
byte dcopy[NR * 2];  /* the copy WritePage started: filled, 0 none */

/* The local request L (LOCAL_TENANT): 0 not yet, 1 holds its page, 2 done. */
#define LOWNER 3
byte lst; byte lpage; byte lep;

/* ---- Prefill node: transfer.Sender and disagg.Prefill ---- */
#define H_NONE 0      /* no handoff (never started, or forgotten) */
#define H_SENDING 1
#define H_ENDED 2     /* aborted and drained, waiting for acks */
byte hph[NR]; bit hjob[NR];
bit hawDec[NR]; bit hawGw[NR]; byte hretry[NR];

/* ---- Gateway: disagg.Router's call ---- */
#define G_IDLE 0
#define G_WAIT 1
#define G_ENDED 2
#define GR_NONE 0
#define GR_OK 1
#define GR_ERR 2
#define GR_ABORT 3
byte gst[NR]; byte gres[NR];
bit ggranted[NR]; bit gcommitted[NR]; bit gaborting[NR];
bit gawDec[NR]; bit gawPf[NR]; byte gretry[NR];

/* ================= decode node ================= */

/* Pool: free a page the sequence holds (kvcache freePage, scrub ZERO). */
inline freePage(p) {
  assert(pwr[p] == 0);          /* I7: no free while a writer is in flight */
  pst[p] = P_FREE; pown[p] = 0; pep[p] = 0; pfill[p] = 0;
#ifndef NO_SCRUB
  wown[p] = 0; wep[p] = 0; wfill[p] = 0; wprev[p] = 0
#endif
}

/* Pool.Release / Pool.Abort of r's sequence: free, or quarantine on a
 * violation. Only pages whose ledger entry still matches are the
 * sequence's to give back. */
inline dropPages(r, quar, i, p) {
  if
  :: sseq[r] ->
     i = 0;
     do
     :: i < NPG(r) ->
        p = stab[IX(r, i)];
        assert(pst[p] == P_OWNED && pown[p] == r + 1 && pep[p] == sep[IX(r, i)]);
        if
        :: quar -> pst[p] = P_QUAR
        :: else -> freePage(p)
        fi;
        stab[IX(r, i)] = 0; sep[IX(r, i)] = 0; simp[IX(r, i)] = 0;
        i++
     :: else -> break
     od;
     sseq[r] = 0; slen[r] = 0; i = 0; p = 0
  :: else
  fi
}

/* sched.Core.end with Lifecycle.Abort: a terminal state is never
 * overwritten (the Go code fails an invariant if it would be). */
inline schedAbort(r, quar, i, p) {
  if
  :: sst[r] == S_PREFILL || sst[r] == S_DECODING ->
     dropPages(r, quar, i, p);
     sst[r] = S_ABORTED
  :: else                          /* already terminal: Abort is idempotent */
  fi
}

/* The relay goroutine: once the handoff settled and the request ended in
 * the scheduler, one Result goes to the gateway and byOw forgets it. */
inline relay(r) {
  if
  :: dsettled[r] && TERMINAL(sst[r]) && !dresult[r] && dbyow[r] ->
     if
     :: sst[r] == S_FINISHED -> sendG(GK_RESULT, r, RES_OK)
     :: else -> sendG(GK_RESULT, r, RES_ERR)
     fi;
     dresult[r] = 1; dbyow[r] = 0
  :: else
  fi
}

/* Receiver.settle: a tombstone; the parties that aborted get AbortAck. */
inline rSettle(r, drained) {
  rph[r] = R_ENDED; rdrained[r] = drained;
  if :: rackGw[r] -> sendG(GK_ACK, r, GFROM_DEC); rackGw[r] = 0 :: else fi;
  if :: rackPf[r] -> sendP(PK_ACK, r, FROM_DEC); rackPf[r] = 0 :: else fi
}

/* Receiver.tryRelease, then the driver's Release effect (endRequest:
 * sched Fail, pages scrubbed and freed). */
inline rTryRelease(r, i, p) {
  if
#ifdef NO_DRAIN
  :: rph[r] == R_DRAIN ->
#else
  :: rph[r] == R_DRAIN && rwriting[r] == 0 ->
#endif
     schedAbort(r, 0, i, p);
     rSettle(r, 1);
     relay(r)
  :: else
  fi
}

/* Receiver.abort: outcome decided once (end), Ended (the relay may go),
 * Abort to the other parties, release once drained. */
inline rAbort(r, o, from, i, p) {
  if
  :: rph[r] == R_RECV ->
     assert(rout[r] == O_NONE);
     rout[r] = o; rph[r] = R_DRAIN;
     dsettled[r] = 1;
     if :: from != FROM_GW -> sendG(GK_ABORT, r, GFROM_DEC); rawGw[r] = 1 :: else fi;
     if :: from != FROM_PF -> sendP(PK_ABORT, r, FROM_DEC); rawPf[r] = 1 :: else fi;
     if :: from == FROM_GW -> rackGw[r] = 1 :: from == FROM_PF -> rackPf[r] = 1 :: else fi;
     rTryRelease(r, i, p)
  :: else
  fi
}

/* Receiver.fence at the drain deadline: stop the writers (the driver's
 * Fence: the copy is cancelled), quarantine every page. */
inline rFence(r, i, p) {
  i = 0;
  do
  :: i < NPG(r) ->
     if
     :: swr[IX(r, i)] > 0 ->
        rwriting[r] = rwriting[r] - swr[IX(r, i)];
        swr[IX(r, i)] = 0; sfen[IX(r, i)] = 1;
        pwr[stab[IX(r, i)]] = 0; dcopy[IX(r, i)] = 0
     :: else
     fi;
     i++
  :: else -> break
  od;
  schedAbort(r, 1, i, p);
  rSettle(r, 0);
  relay(r)
}

/* sched.CommitImport then kvcache.CommitImport (the driver's Deliver). */
inline commitImport(r, tokens, i, p, ok) {
  ok = (sst[r] == S_PREFILL && sseq[r]);
#ifdef TRUST_RESERVATION
  tokens = PROMPT(r);
#endif
  if :: ok && tokens != PROMPT(r) -> ok = 0; schedAbort(r, 0, i, p) :: else fi;
  if
  :: ok ->
#ifdef NO_POOL_COMMIT_CHECK
     tokens = (tokens < 1 -> 1 : (tokens > NPG(r) * PS -> NPG(r) * PS : tokens));
#else
     if :: tokens < 1 || (tokens + PS - 1) / PS != NPG(r) -> ok = 0 :: else fi;
     i = 0;
     do
     :: ok && i < NPG(r) ->
        if :: simp[IX(r, i)] != EXPFILL(tokens, i) -> ok = 0 :: else fi;
        i++
     :: else -> break
     od;
#endif
     if
     :: ok ->
        i = 0;
        do
        :: i < NPG(r) ->
           p = stab[IX(r, i)];
           assert(pst[p] == P_OWNED && pown[p] == r + 1 && pep[p] == sep[IX(r, i)]);
           pfill[p] = EXPFILL(tokens, i);
           i++
        :: else -> break
        od;
        slen[r] = tokens;
        /* The committed handoff is the reserved prompt: exactly the
         * reserved pages, each written by this request under its current
         * allocation with the positions the prompt implies. */
        i = 0;
        do
        :: i < NPG(r) ->
           p = stab[IX(r, i)];
#ifndef FOREIGN_ONLY
           assert(wown[p] == r + 1 && wep[p] == pep[p] && wfill[p] == EXPFILL(PROMPT(r), i));
#endif
           i++
        :: else -> break
        od;
        printf("decode: r%d committed, decoding %d positions\n", r, tokens);
        sst[r] = S_DECODING
     :: else -> schedAbort(r, 0, i, p)
     fi
  :: else
  fi;
  i = 0; p = 0
}

/* Receiver.tryCommit and validate (I6), then Deliver, Ended, Committed. */
inline rTryCommit(r, i, p, ok, k) {
  if
  :: rph[r] == R_RECV && rcommit[r] && rman[r] != 0 && rwriting[r] == 0 &&
     rrecv[r] >= (MPAGES(r, rman[r] - 1) < NPG(r) -> MPAGES(r, rman[r] - 1) : NPG(r)) ->
     ok = 1;
#ifndef NO_MANIFEST_CHECKS
     if :: MPAGES(r, rman[r] - 1) != NPG(r) || rrecv[r] != NPG(r) -> ok = 0 :: else fi;
     if :: MTOTAL(r, rman[r] - 1) != PROMPT(r) -> ok = 0 :: else fi;
     k = (MPAGES(r, rman[r] - 1) < NPG(r) -> MPAGES(r, rman[r] - 1) : NPG(r));
     i = 0;
     do
     :: ok && i < k ->
        if
        :: MFILL(r, rman[r] - 1, i) != EXPFILL(PROMPT(r), i) || !sarr[IX(r, i)] ||
           sfill[IX(r, i)] != EXPFILL(PROMPT(r), i) -> ok = 0
        :: else
        fi;
        i++
     :: else -> break
     od;
#endif
     if
     :: ok ->
        rout[r] = O_COMMITTED; rph[r] = R_ENDED;
        k = MTOTAL(r, rman[r] - 1);
        commitImport(r, k, i, p, ok);
        dsettled[r] = 1;
        sendG(GK_COMMITTED, r, 0);
        relay(r)
     :: else -> rAbort(r, O_ABORTED, NOBODY, i, p)
     fi;
     i = 0; k = 0; ok = 0
  :: else
  fi
}

/* A copy lands: sched.ImportPage (kvcache.ImportPage's ledger check),
 * then Receiver.WriteDone. */
inline land(r, i, p, n, ok, k) {
     p = stab[IX(r, i)]; n = dcopy[IX(r, i)];
     ok = 0;
     if
     :: sst[r] == S_PREFILL && sseq[r] && slen[r] == 0 ->
        /* the ledger says the sequence owns the page (always, here) */
        assert(pst[p] == P_OWNED && pown[p] == r + 1 && pep[p] == sep[IX(r, i)]);
        /* positions n.. keep what they held: the old writer's where it
         * had written them, else what was there before it */
        wprev[p] = (wfill[p] > n -> wown[p] : wprev[p]);
        wown[p] = r + 1; wep[p] = pep[p]; wfill[p] = n;
        simp[IX(r, i)] = n
     :: else -> ok = 1     /* no import pending: the driver aborts the handoff */
     fi;
     pwr[p] = 0; dcopy[IX(r, i)] = 0;
     /* Receiver.WriteDone */
     swr[IX(r, i)]--; rwriting[r]--;
     if
     :: rph[r] == R_RECV -> rTryCommit(r, i, p, n, k)
     :: rph[r] == R_DRAIN -> rTryRelease(r, i, p)
     :: else
     fi;
     if :: ok -> rAbort(r, O_ABORTED, NOBODY, i, p) :: else fi;
     r = 0; i = 0; p = 0; n = 0; ok = 0; k = 0
}

proctype Decode() {
  byte c, rem, k, r, v, i, p, n, ok;
end_loop:
  do
  /* A message. */
  :: atomic {
     cntD > 0 ->
     pickD(c);
     /* the network's faults, at the moment the message would arrive */
     if
     :: d_step { netD[c]--; cntD-- }                  /* delivered */
     :: d_step { ndup < MAXDUP -> ndup++ }             /* delivered; a copy stays in flight */
     :: d_step { nloss < MAXLOSS -> nloss++; netD[c]--; cntD--; c = LOST }  /* lost */
     fi;
     d_step {
     k = c / (NR * NV); r = (c / NV) % NR; v = c % NV;
     }; /* the message's kind, request and variant */
     if
     :: k == DK_GEN -> d_step {
        printf("decode <- generate r%d\n", r);
        /* Decode.generate */
        if
        :: dbyow[r] ->
           if :: rph[r] == R_RECV -> sendG(GK_GRANT, r, 0) :: else fi
        :: !dbyow[r] && rph[r] != R_NONE ->
           sendG(GK_RESULT, r, RES_ERR)  /* PagesNeeded refuses: a tombstone */
        :: !dbyow[r] && rph[r] == R_NONE ->
           /* sched.Core.Reserve: the pages now, or refused */
           n = 0; i = 0;
           do :: i < NP -> if :: pst[i] == P_FREE -> n++ :: else fi; i++ :: else -> break od;
           if
           :: n >= NPG(r) ->
              i = 0; p = 0;
              do
              :: i < NPG(r) ->
                 do :: pst[p] != P_FREE -> p++ :: else -> break od;
                 assert(pwr[p] == 0);     /* no reuse while a writer is in flight */
                 nepoch++;
                 pst[p] = P_OWNED; pown[p] = r + 1; pep[p] = nepoch; pfill[p] = 0;
                 stab[IX(r, i)] = p; sep[IX(r, i)] = nepoch; simp[IX(r, i)] = 0;
                 i++
              :: else -> break
              od;
              sseq[r] = 1; slen[r] = 0; sst[r] = S_PREFILL;
              /* Receiver.Reserve */
              rph[r] = R_RECV; rout[r] = O_NONE;
              dbyow[r] = 1; dsettled[r] = 0; dresult[r] = 0;
              sendG(GK_GRANT, r, 0)
           :: else ->
              sst[r] = S_REJECTED;
              sendG(GK_RESULT, r, RES_OVER)
           fi
        fi
        }
     :: k == DK_PAGE -> d_step {
        printf("decode <- page r%d index %d filled %d\n", r, v / 2, v % 2 + 1);
        /* Receiver.PageArrived (lookup, bounds, duplicates) */
        i = v / 2; n = v % 2 + 1;
        if
        :: rph[r] == R_NONE -> sendP(PK_ABORT, r, FROM_DEC)   /* unknown reservation */
        :: rph[r] == R_DRAIN || rph[r] == R_ENDED -> skip     /* late write: refused */
        :: rph[r] == R_RECV && i >= NPG(r) -> rAbort(r, O_ABORTED, NOBODY, i, p)
        :: rph[r] == R_RECV && i < NPG(r) && sarr[IX(r, i)] && sfill[IX(r, i)] == n -> skip  /* identical copy */
        :: rph[r] == R_RECV && i < NPG(r) && sarr[IX(r, i)] && sfill[IX(r, i)] != n ->
           rAbort(r, O_ABORTED, NOBODY, i, p)                /* two versions */
        :: rph[r] == R_RECV && i < NPG(r) && !sarr[IX(r, i)] ->
           sarr[IX(r, i)] = 1; sfill[IX(r, i)] = n;
           swr[IX(r, i)]++; rrecv[r]++; rwriting[r]++;
           /* WritePage: the driver starts the copy */
           pwr[stab[IX(r, i)]] = 1; dcopy[IX(r, i)] = n;
#ifndef ASYNC_WRITES
           /* The driver copies at once (decode.page): ImportPage, WriteDone. */
           land(r, i, p, n, ok, k)
#endif
        fi
        }
     :: k == DK_MAN -> d_step {
        printf("decode <- manifest r%d (%d pages, %d tokens)\n", r, MPAGES(r, v), MTOTAL(r, v));
        /* Receiver.manifestArrived */
        if
        :: rph[r] == R_NONE -> sendP(PK_ABORT, r, FROM_DEC)
        :: rph[r] == R_DRAIN || rph[r] == R_ENDED -> skip
        :: rph[r] == R_RECV && rman[r] == v + 1 -> skip       /* identical copy */
        :: rph[r] == R_RECV && rman[r] != 0 && rman[r] != v + 1 ->
           rAbort(r, O_ABORTED, NOBODY, i, p)
        :: rph[r] == R_RECV && rman[r] == 0 ->
#ifndef NO_MANIFEST_CHECKS
           if
           :: MPAGES(r, v) != NPG(r) || MTOTAL(r, v) != PROMPT(r) ->
              rAbort(r, O_ABORTED, NOBODY, i, p)
           :: else ->
#endif
              rman[r] = v + 1;
              rTryCommit(r, i, p, ok, n)
#ifndef NO_MANIFEST_CHECKS
           fi
#endif
        fi
        }
     :: k == DK_COMMIT -> d_step {
        printf("decode <- commit r%d\n", r);
        if
        :: rph[r] == R_NONE -> sendP(PK_ABORT, r, FROM_DEC)
        :: rph[r] == R_DRAIN || rph[r] == R_ENDED -> skip
        :: rph[r] == R_RECV && rcommit[r] -> skip             /* second commit */
        :: rph[r] == R_RECV && !rcommit[r] ->
           rcommit[r] = 1;
           rTryCommit(r, i, p, ok, n)
        fi
        }
     :: k == DK_ABORT -> d_step {
        printf("decode <- abort r%d from %d (0 gateway, 1 prefill)\n", r, v);
        /* Receiver.abortArrived */
        if
        :: rph[r] == R_NONE ->
           if :: v == FROM_GW -> sendG(GK_ACK, r, GFROM_DEC) :: else -> sendP(PK_ACK, r, FROM_DEC) fi
        :: rph[r] == R_RECV -> rAbort(r, O_ABORTED, v, i, p)
        :: rph[r] == R_DRAIN ->
           if :: v == FROM_GW -> rackGw[r] = 1 :: else -> rackPf[r] = 1 fi
        :: rph[r] == R_ENDED && rout[r] == O_COMMITTED ->
           /* AbortDelivered: the scheduler aborts the decoding request */
           schedAbort(r, 0, i, p);
           if :: v == FROM_GW -> sendG(GK_ACK, r, GFROM_DEC) :: else -> sendP(PK_ACK, r, FROM_DEC) fi;
           relay(r)
        :: rph[r] == R_ENDED && rout[r] != O_COMMITTED ->
           if :: v == FROM_GW -> sendG(GK_ACK, r, GFROM_DEC) :: else -> sendP(PK_ACK, r, FROM_DEC) fi
        fi
        }
     :: k == DK_ACK -> d_step {
        printf("decode <- abort ack r%d\n", r);
        if :: v == FROM_GW -> rawGw[r] = 0 :: else -> rawPf[r] = 0 fi
        }
     :: else                                  /* lost */
     fi;
     d_step { c = 0; rem = 0; k = 0; r = 0; v = 0; i = 0; p = 0; n = 0; ok = 0 }
     }
#ifdef ASYNC_WRITES
  /* A copy lands. */
  :: d_step { dcopy[IX(0, 0)] > 0 -> r = 0; i = 0; land(r, i, p, n, ok, k) }
  :: d_step { dcopy[IX(0, 1)] > 0 -> r = 0; i = 1; land(r, i, p, n, ok, k) }
  :: d_step { dcopy[IX(1, 0)] > 0 -> r = 1; i = 0; land(r, i, p, n, ok, k) }
#endif
  /* Tick: a lease expires (heartbeats lost or late: any time). */
#ifndef A_NO_LEASE_EXPIRY
  :: d_step { rph[0] == R_RECV -> printf("decode: lease of r0 expired\n"); rAbort(0, O_REAPED, NOBODY, i, p); i = 0; p = 0 }
#endif
#ifndef B_NO_LEASE_EXPIRY
  :: d_step { rph[1] == R_RECV -> printf("decode: lease of r1 expired\n"); rAbort(1, O_REAPED, NOBODY, i, p); i = 0; p = 0 }
#endif
  /* Tick: the drain deadline passes with a writer in flight. */
  :: d_step { rph[0] == R_DRAIN && rwriting[0] > 0 -> rFence(0, i, p); i = 0; p = 0 }
  :: d_step { rph[1] == R_DRAIN && rwriting[1] > 0 -> rFence(1, i, p); i = 0; p = 0 }
  /* Tick: an unacknowledged Abort is sent again. */
  :: d_step {
     (rawGw[0] || rawPf[0]) && rretry[0] < RETRY && rph[0] != R_RECV ->
     if :: rawGw[0] -> sendG(GK_ABORT, 0, GFROM_DEC) :: else fi;
     if :: rawPf[0] -> sendP(PK_ABORT, 0, FROM_DEC) :: else fi;
     rretry[0]++ }
  :: d_step {
     (rawGw[1] || rawPf[1]) && rretry[1] < RETRY && rph[1] != R_RECV ->
     if :: rawGw[1] -> sendG(GK_ABORT, 1, GFROM_DEC) :: else fi;
     if :: rawPf[1] -> sendP(PK_ABORT, 1, FROM_DEC) :: else fi;
     rretry[1]++ }
  od
}

/* One decode step of r in the scheduler loop. */
inline decodeStep(r, i, p, want) {
     /* kvcache verify: every page still the sequence's, fills as the
      * length implies (a mismatch is a violation, never computed on) */
     i = 0; want = 1;
     do
     :: i < NPG(r) ->
        p = stab[IX(r, i)];
        if
        :: pst[p] != P_OWNED || pown[p] != r + 1 || pep[p] != sep[IX(r, i)] ||
           pfill[p] != EXPFILL(slen[r], i) -> want = 0
        :: else
        fi;
        i++
     :: else -> break
     od;
     if
     :: want ->
        /* Attention reads positions [0, slen): each page it reads must
         * hold this request's bytes, written under its current
         * allocation, for every position read (I2, I3). First the
         * cross-tenant property alone: no position read holds another
         * request's bytes ([0, wfill) are wown's, the rest wprev's). */
        i = 0;
        do
        :: i < NPG(r) ->
           p = stab[IX(r, i)];
           if
           :: EXPFILL(slen[r], i) > 0 ->
              if
              :: (wfill[p] > 0 && wown[p] != 0 && wown[p] != r + 1) ||
                 (EXPFILL(slen[r], i) > wfill[p] && wprev[p] != 0 && wprev[p] != r + 1) ->
                 printf("FOREIGN READ: r%d's attention reads page %d, whose first %d positions hold owner %d's bytes and the rest owner %d's (owners: 1 r0, 2 r1, 3 L, 0 nobody)\n",
                        r, p, wfill[p], wown[p], wprev[p]);
                 assert(false)
              :: else
              fi;
#ifndef FOREIGN_ONLY
              assert(pst[p] == P_OWNED && pown[p] == r + 1 && wown[p] == r + 1 &&
                     wep[p] == pep[p] && wfill[p] >= EXPFILL(slen[r], i))
#endif
           :: else
           fi;
           i++
        :: else -> break
        od;
        /* Lifecycle.Finish, pages back scrubbed */
#ifdef NO_SCRUB
        printf("engine: r%d finished; its pages are freed, not scrubbed\n", r);
#else
        printf("engine: r%d finished; its pages are scrubbed and freed\n", r);
#endif
        dropPages(r, 0, i, p);
        sst[r] = S_FINISHED
     :: else ->
        dropPages(r, 1, i, p);
        sst[r] = S_ABORTED
     fi;
     relay(r);
     r = 0; i = 0; p = 0; want = 0
}

/* The decode node's scheduler loop: a decoding request's step (Begin's
 * ledger check, I2, then attention) and the quarantine reaper. */
proctype Engine() {
  byte r, i, p, want;
end_loop:
  do
  :: d_step { sst[0] == S_DECODING -> r = 0; decodeStep(r, i, p, want) }
  :: d_step { sst[1] == S_DECODING -> r = 1; decodeStep(r, i, p, want) }
#ifdef LOCAL_TENANT
  /* Request L of another tenant runs on the decode node itself (serve's
   * colocated path, --also-prefill): its page is allocated, computed in
   * place, read by attention and given back, or aborted at any step. It
   * takes pages request A gave back, and A's late messages find it
   * there. */
  :: d_step {
     lst == 0 && (pst[0] == P_FREE || pst[1] == P_FREE || pst[2] == P_FREE) ->
     p = 0;
     do :: pst[p] != P_FREE -> p++ :: else -> break od;
     assert(pwr[p] == 0);
     nepoch++;
     pst[p] = P_OWNED; pown[p] = LOWNER; pep[p] = nepoch;
     wown[p] = LOWNER; wep[p] = nepoch; wfill[p] = PS; wprev[p] = 0; pfill[p] = PS;
     printf("engine: L takes page %d and writes it\n", p);
     lpage = p; lep = nepoch; lst = 1; p = 0 }
  :: d_step {
     lst == 1 ->
     /* Begin's ledger check, then attention over the page */
     if
     :: pst[lpage] == P_OWNED && pown[lpage] == LOWNER && pep[lpage] == lep ->
        assert(wown[lpage] == LOWNER && wep[lpage] == pep[lpage] && wfill[lpage] >= PS);
        printf("engine: L finished; page %d freed\n", lpage);
        freePage(lpage)
     :: else -> pst[lpage] = P_QUAR
     fi;
     lst = 2; lpage = 0; lep = 0 }
  :: d_step { lst == 1 -> printf("engine: L aborted; page %d freed\n", lpage); freePage(lpage); lst = 2; lpage = 0; lep = 0 }
#endif
  /* sched reap / Pool.ScrubQuarantined: a quarantined page is scrubbed and
   * freed (no batch in flight: steps are atomic here). */
  :: d_step { pst[0] == P_QUAR -> freePage(0) }
  :: d_step { pst[1] == P_QUAR -> freePage(1) }
  :: d_step { pst[2] == P_QUAR -> freePage(2) }
  od
}

/* ================= prefill node ================= */

/* Prefill computed the prompt (Prefill.exported): PageReady for every
 * page, PrefillDone, trySeal (manifest, commit), forget. */
inline computeFull(r) {
  printf("prefill: r%d computed\n", r);
  hjob[r] = 0;
  sendD(DK_PAGE, r, 0 * 2 + EXPFILL(PROMPT(r), 0) - 1);
  if :: NPG(r) > 1 -> sendD(DK_PAGE, r, 1 * 2 + EXPFILL(PROMPT(r), 1) - 1) :: else fi;
  sendD(DK_MAN, r, MFULL); sendD(DK_COMMIT, r, 0);
  hph[r] = H_NONE
}

/* A prefill with the incident's bug: a 1-token placeholder, which its
 * sender does not check; decode must not rely on the sender being right. */
inline computeShort(r) {
  printf("prefill: r%d computed as a 1-token placeholder\n", r);
  hjob[r] = 0;
  sendD(DK_PAGE, r, 0); sendD(DK_MAN, r, MSHORT); sendD(DK_COMMIT, r, 0);
  hph[r] = H_NONE
}

/* Prefill failed: Sender.Abort(ReasonPrefillFailed). */
inline computeFail(r) {
  printf("prefill: r%d failed\n", r);
  hjob[r] = 0; hph[r] = H_ENDED;
  sendD(DK_ABORT, r, FROM_PF); hawDec[r] = 1;
  sendG(GK_ABORT, r, GFROM_PF); hawGw[r] = 1
}

proctype Prefill() {
  byte c, rem, k, r, v;
end_loop:
  do
  :: atomic {
     cntP > 0 ->
     pickP(c);
     /* the network's faults, at the moment the message would arrive */
     if
     :: d_step { netP[c]--; cntP-- }                  /* delivered */
     :: d_step { ndup < MAXDUP -> ndup++ }             /* delivered; a copy stays in flight */
     :: d_step { nloss < MAXLOSS -> nloss++; netP[c]--; cntP--; c = LOST }  /* lost */
     fi;
     d_step {
     k = c / (NR * NV); r = (c / NV) % NR; v = c % NV;
     if
     :: k == PK_PREFILL ->
        printf("prefill <- prefill r%d\n", r);
        /* Prefill.start, Sender.Start: a repeated grant is ignored while
         * the handoff is remembered; after it was forgotten it starts
         * again (and its pages are late at decode). */
        if
        :: hph[r] == H_NONE -> hph[r] = H_SENDING; hjob[r] = 1; hretry[r] = 0
        :: else
        fi
     :: k == PK_ABORT ->
        printf("prefill <- abort r%d from %d (0 gateway, 1 decode)\n", r, v);
        /* Sender.Step(Abort); the driver cancels the job */
        if
        :: hph[r] == H_SENDING ->
           hph[r] = H_ENDED; hjob[r] = 0;
           if :: v != FROM_DEC -> sendD(DK_ABORT, r, FROM_PF); hawDec[r] = 1 :: else fi;
           if :: v != FROM_GW -> sendG(GK_ABORT, r, GFROM_PF); hawGw[r] = 1 :: else fi;
           /* drained at once (the driver's reads are synchronous) */
           if :: v == FROM_DEC -> sendD(DK_ACK, r, FROM_PF) :: else -> sendG(GK_ACK, r, GFROM_PF) fi
        :: else ->
           if :: v == FROM_DEC -> sendD(DK_ACK, r, FROM_PF) :: else -> sendG(GK_ACK, r, GFROM_PF) fi
        fi
     :: k == PK_ACK ->
        if
        :: hph[r] == H_ENDED ->
           if :: v == FROM_DEC -> hawDec[r] = 0 :: else -> hawGw[r] = 0 fi;
           if :: !hawDec[r] && !hawGw[r] -> hph[r] = H_NONE; hretry[r] = 0 :: else fi
        :: else
        fi
     :: else                                  /* lost */
     fi;
     c = 0; rem = 0; k = 0; r = 0; v = 0
     }
     }
  /* Prefill computed the prompt (Prefill.exported): PageReady for every
   * page, PrefillDone, trySeal (manifest, commit), forget. FULL is the
   * granted prompt; SHORT is a prefill with the incident's bug (a 1-token
   * placeholder) whose sender does not check it: decode must not rely on
   * the sender being right. */
  /* Prefill's job ends: the granted prompt, the placeholder, or a failure. */
  :: d_step { hjob[0] && hph[0] == H_SENDING -> computeFull(0) }
#ifndef A_CORRECT_PREFILL
  :: d_step { hjob[0] && hph[0] == H_SENDING -> computeShort(0) }
  :: d_step { hjob[0] && hph[0] == H_SENDING -> computeFail(0) }
#endif
  :: d_step { hjob[1] && hph[1] == H_SENDING -> computeFull(1) }
#ifndef B_CORRECT_PREFILL
  :: d_step { hjob[1] && hph[1] == H_SENDING -> computeShort(1) }
  :: d_step { hjob[1] && hph[1] == H_SENDING -> computeFail(1) }
#endif
  /* Tick: unacknowledged aborts again; AbortTTL forgets the handoff. */
  :: d_step {
     hph[0] == H_ENDED && hretry[0] < RETRY ->
     if :: hawDec[0] -> sendD(DK_ABORT, 0, FROM_PF) :: else fi;
     if :: hawGw[0] -> sendG(GK_ABORT, 0, GFROM_PF) :: else fi;
     hretry[0]++ }
  :: d_step {
     hph[1] == H_ENDED && hretry[1] < RETRY ->
     if :: hawDec[1] -> sendD(DK_ABORT, 1, FROM_PF) :: else fi;
     if :: hawGw[1] -> sendG(GK_ABORT, 1, GFROM_PF) :: else fi;
     hretry[1]++ }
  :: d_step { hph[0] == H_ENDED && hretry[0] == RETRY -> hph[0] = H_NONE; hawDec[0] = 0; hawGw[0] = 0; hretry[0] = 0 }
  :: d_step { hph[1] == H_ENDED && hretry[1] == RETRY -> hph[1] = H_NONE; hawDec[1] = 0; hawGw[1] = 0; hretry[1] = 0 }
  od
}

/* ================= gateway ================= */

inline gEnd(r, res) {
  if
  :: gst[r] != G_ENDED ->
     /* I10: success only for a request that committed and finished at
      * decode. */
     assert(res != GR_OK || (gcommitted[r] && sst[r] == S_FINISHED));
     gst[r] = G_ENDED; gres[r] = res
  :: else
  fi
}

proctype Gateway() {
  byte c, rem, k, r, v;
end_loop:
  do
  /* A client's request: Router.Submit, reserve (Generate to decode). */
#ifndef TWO_REQUESTS
  :: d_step { gst[0] == G_IDLE -> printf("gateway: r0 submitted\n"); gst[0] = G_WAIT; sendD(DK_GEN, 0, 0) }
#endif
  /* The client leaves: Router.abort (once). */
#ifndef A_NO_CLIENT_ABORT
  :: d_step {
     gst[0] == G_WAIT && !gaborting[0] ->
     gaborting[0] = 1; sendD(DK_ABORT, 0, FROM_GW); gawDec[0] = 1;
     if :: ggranted[0] -> sendP(PK_ABORT, 0, FROM_GW); gawPf[0] = 1 :: else fi }
#endif
#ifndef B_NO_CLIENT_ABORT
  :: d_step {
     gst[1] == G_WAIT && !gaborting[1] ->
     gaborting[1] = 1; sendD(DK_ABORT, 1, FROM_GW); gawDec[1] = 1;
     if :: ggranted[1] -> sendP(PK_ABORT, 1, FROM_GW); gawPf[1] = 1 :: else fi }
#endif
  /* AbortWait passes without a result. */
  :: d_step { gst[0] == G_WAIT && gaborting[0] -> gEnd(0, GR_ABORT) }
  :: d_step { gst[1] == G_WAIT && gaborting[1] -> gEnd(1, GR_ABORT) }
  /* sendAbort's retry. */
  :: d_step {
     (gawDec[0] || gawPf[0]) && gretry[0] < RETRY ->
     if :: gawDec[0] -> sendD(DK_ABORT, 0, FROM_GW) :: else fi;
     if :: gawPf[0] -> sendP(PK_ABORT, 0, FROM_GW) :: else fi;
     gretry[0]++ }
  :: d_step {
     (gawDec[1] || gawPf[1]) && gretry[1] < RETRY ->
     if :: gawDec[1] -> sendD(DK_ABORT, 1, FROM_GW) :: else fi;
     if :: gawPf[1] -> sendP(PK_ABORT, 1, FROM_GW) :: else fi;
     gretry[1]++ }
  /* A message: Router.inbound. */
  :: atomic {
     cntG > 0 ->
     pickG(c);
     /* the network's faults, at the moment the message would arrive */
     if
     :: d_step { netG[c]--; cntG-- }                  /* delivered */
     :: d_step { ndup < MAXDUP -> ndup++ }             /* delivered; a copy stays in flight */
     :: d_step { nloss < MAXLOSS -> nloss++; netG[c]--; cntG--; c = LOST }  /* lost */
     fi;
     d_step {
     k = c / (NR * NV); r = (c / NV) % NR; v = c % NV;
     if
     :: k == GK_GRANT ->
        printf("gateway <- grant r%d\n", r);
        if
        :: gst[r] == G_WAIT ->
           ggranted[r] = 1;
           if
           :: gaborting[r] ->
              /* the reservation is given back now, not by lease */
              sendD(DK_ABORT, r, FROM_GW); gawDec[r] = 1; gawPf[r] = 0
           :: else -> sendP(PK_PREFILL, r, 0)
           fi
        :: else
        fi
     :: k == GK_COMMITTED ->
        printf("gateway <- committed r%d\n", r);
        if :: gst[r] == G_WAIT -> gcommitted[r] = 1 :: else fi
     :: k == GK_RESULT ->
        printf("gateway <- result r%d (%d: 0 ok, 1 overloaded, 2 error)\n", r, v);
        if
        :: gst[r] == G_WAIT ->
           if
           :: v == RES_OK && gcommitted[r] -> gEnd(r, GR_OK)
           :: else -> gEnd(r, GR_ERR)  /* refused, failed, or success before the commit */
           fi
        :: else
        fi
     :: k == GK_ABORT ->
        printf("gateway <- abort r%d\n", r);
        if :: v == GFROM_DEC -> sendD(DK_ACK, r, FROM_GW) :: else -> sendP(PK_ACK, r, FROM_GW) fi;
        if
        :: gst[r] == G_WAIT -> gEnd(r, GR_ERR)   /* Router.fail */
        :: else
        fi
     :: k == GK_ACK ->
        if :: v == GFROM_DEC -> gawDec[r] = 0 :: else -> gawPf[r] = 0 fi
     :: else                                  /* lost */
     fi;
     c = 0; rem = 0; k = 0; r = 0; v = 0
     }
     }
  od
}

init {
  atomic {
#ifdef TWO_REQUESTS
    /* Both requests are submitted at the start: a Generate waits in the
     * bag until decode takes it, which it may do at any later step, so
     * this is every submission order and time, without the interleavings
     * of the submissions themselves. (Each Generate holds a place in
     * decode's inbox meanwhile: CAPD counts it.) */
    printf("gateway: r0 and r1 submitted\n");
    gst[0] = G_WAIT; sendD(DK_GEN, 0, 0);
    gst[1] = G_WAIT; sendD(DK_GEN, 1, 0);
#endif
    run Gateway(); run Decode(); run Prefill(); run Engine()
  }
}

/* Liveness: every page of the decode pool is eventually, and then for
 * ever, free or quarantined, with no writer in flight. Checked with
 * pan -a and -DLIVENESS (no fairness assumption: docs/spin.md says why
 * not -f). */
#ifdef LIVENESS
#define settled (pst[0] != P_OWNED && pst[1] != P_OWNED && pst[2] != P_OWNED && \
                 pwr[0] == 0 && pwr[1] == 0 && pwr[2] == 0)
#ifdef TWO_REQUESTS
/* With two requests also: each request ends in decode's scheduler (both
 * Generates are in decode's inbox from the start, so both are taken). The
 * gateway's end is not required: a Result or Abort lost to a full inbox
 * leaves it waiting, and the request's own deadline is not modelled. */
#define ended (TERMINAL(sst[0]) && TERMINAL(sst[1]))
ltl pages_settle { <> [] (settled && ended) }
#else
ltl pages_settle { <> [] settled }
#endif
#endif
