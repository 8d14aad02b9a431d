// Drives the agentbay console in headless Chromium: signs in, opens an
// attempt timeline that waits for an approval, approves it from the inbox in
// a second tab and watches the first one resume live, tightens a quota,
// submits a run and sees its lease wait with the quota named; then, with
// JavaScript off, sorts, filters and reads a timeline; last, follows the
// link a reviewer was mailed, signs in as that reviewer and lands on the
// decision. Saves a screenshot of every step. Prints one JSON line; exits
// non-zero on failure.
//
//   AGENTBAY_URL, AGENTBAY_USER, AGENTBAY_PASSWORD, SCREENSHOTS (directory),
//   AGENTBAY_MAIL_USER and AGENTBAY_MAIL_LINK (a file where the link mailed
//   to that user appears), CHROMIUM (default /usr/bin/chromium)

import { chromium } from "playwright-core";
import { existsSync, mkdirSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { execFileSync } from "node:child_process";

const url = process.env.AGENTBAY_URL;
const user = process.env.AGENTBAY_USER;
const password = process.env.AGENTBAY_PASSWORD;
const shots = process.env.SCREENSHOTS;
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
mkdirSync(shots, { recursive: true });

const steps = [];
const EDITED = "Checkout down at globex: page the payments on-call";
const problems = [];
const browser = await chromium.launch({ executablePath, args: ["--no-sandbox"] });
const context = await browser.newContext({
  // The appliance's certificate is self-signed on a fresh install; the Rust
  // side of the test pins it, the browser only needs to reach the pages.
  ignoreHTTPSErrors: true,
  viewport: { width: 1280, height: 860 },
});

function watch(page) {
  page.on("console", (m) => { if (m.type() === "error") problems.push(`console: ${m.text()}`); });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("requestfailed", (r) => {
    // A request the browser itself cancelled (an EventSource or a
    // stylesheet still loading when the test navigates on) is not a
    // failure of the appliance.
    const why = r.failure()?.errorText;
    if (why !== "net::ERR_ABORTED" && !r.url().includes("/live")) problems.push(`request failed: ${r.url()} ${why}`);
  });
}

// Screenshots at 1280 px; a page that scrolls sideways is a problem.
async function shot(page, name) {
  const path = join(shots, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  const overflow = await page.evaluate(
    () => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  if (overflow > 0) problems.push(`${name} scrolls sideways by ${overflow} px at 1280 px`);
  steps.push(name);
}

function expect(cond, message) {
  if (!cond) throw new Error(message);
}

try {
  const page = await context.newPage();
  watch(page);

  // 1. Sign in: an unauthenticated visit lands on the sign-in form.
  await page.goto(`${url}/`);
  expect(page.url().includes("/signin"), `not sent to sign in: ${page.url()}`);
  await shot(page, "01-signin");
  await page.fill("input[name=username]", user);
  await page.fill("input[name=password]", password);
  await page.click("button:has-text('Sign in')");
  await page.waitForSelector("h1:has-text('Overview')");
  const cookies = await context.cookies();
  const session = cookies.find((c) => c.name === "__Host-agentbay_session");
  expect(session && session.httpOnly && session.secure && session.sameSite === "Strict",
    `session cookie attributes: ${JSON.stringify(session)}`);
  await shot(page, "02-overview");
  // Ids show their random end; the copy button next to one copies it whole.
  await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: url });
  const firstRun = page.locator("#recent-runs tbody a[data-copy]").first();
  const whole = await firstRun.getAttribute("data-copy");
  expect(/^[0-9a-f-]{36}$/.test(whole) && (await firstRun.textContent()).endsWith(whole.slice(-8)),
    `an id link shows its end and carries the whole id: ${whole}`);
  // The icon is drawn, not a glyph a font may lack (an empty box).
  const drawn = await page.locator("#recent-runs tbody button.copy svg path").first().boundingBox();
  expect(drawn && drawn.width >= 6 && drawn.height >= 6, `the copy icon is drawn: ${JSON.stringify(drawn)}`);
  await page.locator("#recent-runs tbody button.copy").first().click();
  const copied = await page.evaluate(() => navigator.clipboard.readText());
  expect(copied === whole, `the copy button copied ${copied}, not ${whole}`);

  // 2. The attempt waiting for a decision, through the filter form.
  await page.click("nav.main a:has-text('Attempts')");
  await page.selectOption("form.filters select[name=state]", "WaitingForDecision");
  await page.click("form.filters button:has-text('Filter')");
  await page.waitForURL(/state=WaitingForDecision/);
  // Times read as how long ago, the exact time on hover.
  const started = page.locator("#attempts tbody time.local").first();
  const ago = (await started.textContent()).trim();
  const exact = await started.getAttribute("title");
  expect(/^\d+ (s|min|h|d) ago$/.test(ago) && / UTC \(.* local\)$/.test(exact),
    `a time reads "${ago}", exactly "${exact}"`);
  await page.click("#attempts tbody tr:has-text('approval') a[href^='/attempts/']");
  await page.waitForSelector("#waiting");
  const why = await page.textContent("#waiting");
  expect(/approval/.test(why), `the timeline does not say it waits for an approval: ${why}`);
  expect((await page.textContent("#attempt-state")).trim() === "WaitingForDecision", "state badge");
  await shot(page, "03-timeline-waiting");
  // The model's turns so far, served with the page; the next is written live.
  const turnsServed = await page.locator("#model-text pre.turn").count();
  expect(turnsServed >= 1, `the page shows the model's text so far: ${turnsServed} turns`);

  // 3. Approve in a second tab; the first tab's timeline resumes live.
  const inbox = await context.newPage();
  watch(inbox);
  // The reviewer changes the page's message before approving it: the
  // release's policy lets a reviewer edit page-oncall's arguments.
  await inbox.goto(`${url}/decisions`);
  const approval = inbox.locator(".decision.approval").first();
  await approval.locator("input[name=reason]").fill("on-call confirmed; name the service");
  await approval.locator("details.edit-call summary").click();
  const proposed = await approval.locator("[name='f.message']").inputValue();
  expect(proposed.length > 0, "the edit form holds the proposed arguments");
  await approval.locator("[name='f.message']").fill(EDITED);
  await approval.locator("button:has-text('Approve with these arguments')").click();
  await inbox.waitForSelector(".flash.ok");
  const approved = await inbox.textContent(".flash.ok");
  expect(/approved with the changed arguments/.test(approved), `approval message: ${approved}`);
  await shot(inbox, "04-decision-approved");
  // The demo's other question: the support lead answers it with a JSON
  // document its schema accepts.
  const question = await inbox.textContent(".decision.input pre.artifact");
  expect(/How many/.test(question), `the inbox shows the question: ${question}`);
  // It is answered through a form of the question's schema; an answer
  // the schema refuses is refused, the typed value kept.
  const wrong = "-5";
  await inbox.fill(".decision.input [name='f.affectedUsers']", wrong);
  await inbox.click(".decision.input button:has-text('Answer')");
  await inbox.waitForSelector(".decision.input .field-error");
  const kept = await inbox.inputValue(".decision.input [name='f.affectedUsers']");
  expect(kept === wrong, `the refused answer is kept in its field: ${kept}`);
  const refusal = await inbox.textContent(".decision.input .field-error");
  expect(/affectedUsers/.test(refusal), `the reason names the field: ${refusal}`);
  await shot(inbox, "04b-wrong-answer-kept");
  await inbox.fill(".decision.input [name='f.affectedUsers']", "40");
  await inbox.fill(".decision.input [name='f.since']", "Monday");
  await inbox.click(".decision.input button:has-text('Answer')");
  await inbox.waitForSelector(".flash.ok");
  expect(await inbox.locator(".field-error").count() === 0, "no refusal note after a good answer");
  await inbox.close();
  await page.waitForFunction(
    () => document.querySelector("#attempt-state")?.textContent.trim() === "Succeeded",
    null, { timeout: 15000 });
  const updated = await page.getAttribute("#live", "data-updated");
  expect(updated, "the timeline was updated over server-sent events, not reloaded");
  await shot(page, "05-timeline-resumed-live");
  // The turn after the approval came over the text stream as it was written.
  await page.waitForFunction(
    (n) => document.querySelectorAll("#model-text pre.turn").length > n, turnsServed, { timeout: 15000 });
  const lastTurn = await page.locator("#model-text pre.turn").last();
  expect((await lastTurn.textContent()).length > 0, "the live turn has its text");
  expect(!(await lastTurn.getAttribute("class")).includes("writing"), "the live turn ended");
  // What happened: the first call's conversation, readable.
  await page.click("#calls tr.call-content summary >> nth=0");
  await page.waitForSelector("#calls details[open] ol.conversation li.msg.system");
  const conversation = await page.textContent("#calls details[open] ol.conversation");
  expect(/Task input/.test(conversation), `the model call's conversation: ${conversation}`);
  await shot(page, "05b-call-content");

  // The run as one story: the approval with who and why, and the call made
  // with the arguments the reviewer approved.
  await page.click("dd a[href^='/runs/']");
  await page.waitForSelector(".attempt-story");
  const story = await page.textContent("main");
  expect(/on-call confirmed; name the service/.test(story) && /approved by/.test(story),
    `the run's story names the decision, who and why: ${story}`);
  const request = await page.locator("tr:has-text('page-oncall') a:has-text('request')").getAttribute("href");
  const made = await (await page.request.get(`${url}${request}`)).text();
  expect(made.includes(EDITED), `the call made carries the edited message: ${made}`);
  await shot(page, "05c-run-story");
  // Its export opens offline, with no script, and tells the same story.
  const [download] = await Promise.all([page.waitForEvent("download"), page.click("#export")]);
  const dir = mkdtempSync(join(tmpdir(), "agentbay-export-"));
  const archive = join(dir, "run.tar.gz");
  await download.saveAs(archive);
  execFileSync("tar", ["-xzf", archive, "-C", dir]);
  const root = execFileSync("sh", ["-c", `ls -d ${dir}/run-*`]).toString().trim();
  const offline = await browser.newContext({ javaScriptEnabled: false, offline: true, viewport: { width: 1280, height: 860 } });
  const exported = await offline.newPage();
  await exported.goto(`file://${root}/index.html`);
  const told = await exported.textContent("body");
  expect(/globex/.test(told), `the export shows the input: ${told}`);
  expect(/on-call confirmed; name the service/.test(told), `the export shows the decision's reason: ${told}`);
  expect(/severity/.test(await exported.textContent("#output")), `the export shows the output: ${told}`);
  expect(!readFileSync(join(root, "index.html"), "utf8").includes("<script"), "the export's page has no script");
  await shot(exported, "05d-export-offline");
  await offline.close();

  // 4. Tighten the project's quota to one concurrent run.
  await page.click("nav.main a:has-text('Quotas')");
  await page.selectOption("#set-quota select[name=scope]", "project.demo.support");
  await page.fill("#set-quota input[name=concurrentRuns]", "1");
  await page.click("#set-quota button:has-text('Save quota')");
  await page.waitForSelector(".flash");
  const saved = await page.textContent(".flash");
  expect(/saved/.test(saved), `quota not saved: ${saved}`);
  // A value that loosens the parent is refused with the reason.
  await page.selectOption("#set-quota select[name=scope]", "project.demo.support");
  await page.fill("#set-quota input[name=concurrentRuns]", "100000");
  await page.click("#set-quota button:has-text('Save quota')");
  await page.waitForSelector(".flash.bad");
  const refused = await page.textContent(".flash.bad");
  expect(/concurrentRuns/.test(refused), `loosening not refused by name: ${refused}`);
  await shot(page, "06-quota-tightened");

  // 5. One run holds the project's only slot while it waits for a
  // reviewer; the next one waits for capacity and says which quota holds it.
  // A run is submitted through the form the release's input schema makes.
  async function submit(release, fields, name) {
    await page.click("nav.main a:has-text('Runs')");
    await page.selectOption("#pick-release select[name=release]", release);
    await page.click("#pick-release button");
    await page.waitForSelector("#submit-run");
    await page.selectOption("#submit-run select[name=projectId]", "support");
    for (const [field, value] of Object.entries(fields)) {
      await page.fill(`#submit-run [name='f.${field}']`, value);
    }
    if (name) await shot(page, name);
    await page.click("#submit-run button:has-text('Submit')");
    await page.waitForSelector("h1:has-text('Run')");
    await page.click(".attempt-story h3 a[href^='/attempts/']");
    await page.waitForSelector("#attempt-state");
  }
  await submit("triage-approval-1.0.0", { customer: "globex", text: "Checkout is down again." }, "06b-submit-form");
  await page.waitForFunction(
    () => document.querySelector("#attempt-state")?.textContent.trim() === "WaitingForDecision",
    null, { timeout: 15000 });
  await submit("triage-1.0.0", { customer: "initech", text: "The printer is on fire." });
  // The page may come before the lease request is refused; it follows live.
  await page.waitForFunction(
    () => /concurrentRuns/.test(document.querySelector("#waiting")?.textContent ?? ""),
    null, { timeout: 15000 }).catch(() => {});
  const wait = await page.textContent("#waiting");
  expect(/capacity/.test(wait) && /concurrentRuns/.test(wait), `no quota named in the wait: ${wait}`);
  await shot(page, "07-lease-waits-with-reason");

  await page.click("nav.main a:has-text('Leases')");
  await page.waitForSelector("#leases");
  const leases = await page.textContent("#leases");
  expect(/Requested/.test(leases) && /concurrentRuns/.test(leases), `the waiting lease is not listed with its reason: ${leases}`);
  await shot(page, "08-leases");

  await page.click("nav.main a:has-text('Pools')");
  await page.waitForSelector("svg.bar");
  const legend = await page.textContent("p.legend");
  expect(/CPU granted/.test(legend) && /maxSize/.test(legend), `the pool bars have a legend: ${legend}`);
  await shot(page, "09-pools");

  // A release's page: every verdict, the files it pins, the manifest; the
  // list says why each release is as it is, and offers the upload.
  await page.click("nav.main a:has-text('Releases')");
  await page.waitForSelector("#releases");
  expect(await page.locator("form[enctype='multipart/form-data'] input[type=file]").count() === 1,
    "the administrator may import a release by upload");
  await page.click("#releases tbody a[href='/releases/triage-1.0.0']");
  await page.waitForSelector("#verdicts");
  const verdicts = await page.textContent("#verdicts");
  expect(/stored as Verified/.test(verdicts), `the release's verdicts: ${verdicts}`);
  const files = await page.textContent("#files");
  expect(/instructions\.md/.test(files), `the files it pins: ${files}`);
  await shot(page, "09b-release");

  // A run whose agent code raised: found by its label, its page shows the
  // error and the traceback the adapter reported.
  await page.goto(`${url}/runs?label=ticket%3DINC-7`);
  await page.click("#runs tbody a[href^='/runs/']");
  await page.waitForSelector(".attempt-story");
  const failure = await page.textContent(".attempt-story .failure");
  expect(/agent/.test(failure) && /KeyError/.test(failure), `the failure says whose it is: ${failure}`);
  const traceback = await page.textContent(".attempt-story .traceback");
  expect(/customer_name/.test(traceback) && /in summarise/.test(traceback), `the traceback is shown: ${traceback}`);
  await shot(page, "09d-failed-run-traceback");

  // The audit trail: the approval, the quota and the sign-in of this
  // session, each with who and from where; filtered by action; exports.
  await page.click("nav.main a:has-text('Audit')");
  await page.waitForSelector("#audit");
  const trail = await page.textContent("#audit");
  for (const action of ["approval.decide", "quota.set", "session.sign-in"]) {
    expect(trail.includes(action), `the audit trail lists ${action}: ${trail}`);
  }
  expect(/user wendy/.test(trail) && /\(console\)/.test(trail), `the audit trail names who and through which door: ${trail}`);
  expect(await page.locator("a[href^='/audit.csv']").count() === 1, "the audit page offers a CSV export");
  await page.selectOption("form.filters select[name=action]", "approval.decide");
  await page.click("form.filters button:has-text('Filter')");
  await page.waitForURL(/action=approval.decide/);
  const approvals = await page.locator("#audit tbody tr").allTextContents();
  expect(approvals.length >= 1 && approvals.every((r) => r.includes("approval.decide")),
    `filtered by action: ${approvals.join(" | ")}`);
  await shot(page, "09c-audit");

  // 6. Without JavaScript: sign in, sort and filter a table, read a
  // timeline — everything is in the served HTML.
  const plain = await browser.newContext({ ignoreHTTPSErrors: true, javaScriptEnabled: false, viewport: { width: 1280, height: 860 } });
  const nojs = await plain.newPage();
  watch(nojs);
  await nojs.goto(`${url}/signin`);
  await nojs.fill("input[name=username]", user);
  await nojs.fill("input[name=password]", password);
  await nojs.click("button:has-text('Sign in')");
  await nojs.waitForSelector("h1:has-text('Overview')");
  await nojs.goto(`${url}/attempts`);
  await nojs.click("#attempts thead a:has-text('State')");
  await nojs.waitForURL(/sort=state&dir=asc/);
  await nojs.fill("form.filters input[name=q]", "WaitingForDecision");
  await nojs.click("form.filters button:has-text('Filter')");
  await nojs.waitForURL(/q=WaitingForDecision/);
  await nojs.click("#attempts tbody tr:has-text('approval') a[href^='/attempts/']");
  await nojs.waitForSelector("#waiting");
  expect(/approval/.test(await nojs.textContent("#waiting")), "the timeline without JavaScript says why it waits");
  await shot(nojs, "10-without-javascript");
  await plain.close();

  // 7. A reviewer was mailed the approval the run of step 5 waits for:
  // the link opens the sign-in first, then the decision, to be decided
  // there (the link decides nothing by itself).
  const linkFile = process.env.AGENTBAY_MAIL_LINK;
  const mailDeadline = Date.now() + 30000;
  while (!existsSync(linkFile) && Date.now() < mailDeadline) await new Promise((r) => setTimeout(r, 200));
  expect(existsSync(linkFile), "no mail reached the reviewer");
  const mailedLink = readFileSync(linkFile, "utf8").trim();
  const mailed = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1280, height: 860 } });
  const fromMail = await mailed.newPage();
  watch(fromMail);
  // The link names this host as the appliance sees itself; the test
  // reaches it at its listening address.
  await fromMail.goto(`${url}${mailedLink.slice(mailedLink.indexOf("/l/"))}`);
  expect(fromMail.url().includes("/signin") && fromMail.url().includes("next=%2Fl%2F"),
    `the link did not ask for a sign-in first: ${fromMail.url()}`);
  await shot(fromMail, "11-mailed-link-signs-in");
  await fromMail.fill("input[name=username]", process.env.AGENTBAY_MAIL_USER);
  await fromMail.fill("input[name=password]", password);
  await fromMail.click("button:has-text('Sign in')");
  await fromMail.waitForSelector("#the-decision");
  expect(/\/attempts\/[^/]+\/decisions\//.test(fromMail.url()), `not on the decision: ${fromMail.url()}`);
  const mailedDecision = await fromMail.textContent("#the-decision");
  expect(/page-oncall/.test(mailedDecision), `the decision's call is not shown: ${mailedDecision}`);
  const mailedTo = await fromMail.textContent("#told");
  expect(new RegExp(`${process.env.AGENTBAY_MAIL_USER} <`).test(mailedTo) && /sent/.test(mailedTo),
    `the page does not say who was mailed: ${mailedTo}`);
  await shot(fromMail, "12-decision-from-mail");
  await mailed.close();

  expect(problems.length === 0, `browser problems: ${problems.join("; ")}`);
  console.log(JSON.stringify({ ok: true, steps }));
  await browser.close();
} catch (e) {
  console.log(JSON.stringify({ ok: false, steps, error: String(e), problems }));
  await browser.close();
  process.exit(1);
}
