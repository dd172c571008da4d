"""The approvals page in a real browser (Debian's headless Chromium, driven by Selenium).

Usage: approvals.py ADMIN_URL APPROVER_TOKEN REQUESTER_TOKEN VIEWER_TOKEN SCREENSHOT_DIR ORIGIN_PORT PROXY_ADDR

As an approver: a deny through the proxy appears live; a request filed through the API
appears without a reload; approve it with a TTL choice (the list of choices has no value
twice) and it moves to the active list in place, the live denies still shown; revoke it
with a note after a confirmation; deny another with a note; allow the live deny for five
minutes in one click, and the next request through the proxy passes. A tweak request is
listed with its sandbox and what it asks in words; the approver narrows it (a workspace
outside the one asked is refused, naming the field), approves, sees the narrowed tweak
listed, and revokes it with a note after a confirmation. Then as a viewer: the lists, and
no action. The page must never reload. One screenshot per step goes to
SCREENSHOT_DIR. Prints OK at the end; any failure raises.
"""

import json
import os
import sys
import tempfile
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

admin, approver, requester, viewer, shots, origin_port, proxy = sys.argv[1:8]
os.makedirs(shots, exist_ok=True)
steps = []


def api(method, path, token, body=None):
    req = urllib.request.Request(admin + path, method=method, data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", "Bearer " + token)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def through_proxy(path, host="web.test"):
    """The status of a GET through the proxy's t-1 listener."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://" + proxy}))
    try:
        with opener.open("http://%s:%s/%s" % (host, origin_port, path), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def shot(name):
    path = os.path.join(shots, "%02d-%s.png" % (len(steps) + 1, name))
    driver.save_screenshot(path)
    steps.append(path)


def text(element_id):
    return driver.find_element(By.ID, element_id).text


def headers(table):
    return [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#%s thead th" % table)]


def click(element_id):
    wait.until(lambda d: d.find_elements(By.ID, element_id))
    driver.find_element(By.ID, element_id).click()


def not_reloaded():
    assert driver.execute_script("return performance.timeOrigin") == loaded, "the page reloaded"


opts = webdriver.ChromeOptions()
opts.binary_location = "/usr/bin/chromium"
for flag in ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--window-size=1400,1000", "--user-data-dir=" + tempfile.mkdtemp()]:
    opts.add_argument(flag)
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
# A navigation (the login) or a redraw can replace an element between finding and reading it.
wait = WebDriverWait(driver, 15, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException])
try:
    driver.get(admin + "/ui")
    driver.find_element(By.ID, "token").send_keys(approver)
    driver.find_element(By.ID, "login").click()
    wait.until(lambda d: "Logged in as alice (approver)" in d.find_element(By.TAG_NAME, "body").text)
    assert "tok-" not in driver.current_url and approver not in driver.page_source, "the token leaked into the page"
    cookie = driver.get_cookie("sandgate_session")
    assert cookie and cookie["httpOnly"] and cookie["sameSite"] == "Strict", cookie
    loaded = driver.execute_script("return performance.timeOrigin")
    # Times arrive as Unix seconds or RFC 3339 text; the page reads both.
    read = driver.execute_script(
        "return [1700000000, '2023-11-14T22:13:20Z', '2023-11-14T23:13:20+01:00', '1700000000', null].map(secs)")
    assert read == [1700000000, 1700000000, 1700000000, 1700000000, None], read
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "body[data-live=open]"))
    for table, first in [("pending", "Requested"), ("active", "Approved"), ("recent", "Outcome"), ("denies", "Last seen")]:
        assert headers(table)[0] == first, (table, headers(table))
    assert "Ports" in headers("recent") and "Note" in headers("recent") and "For" in headers("recent"), headers("recent")

    # 1. A deny through the proxy shows up as it happens, with a one-click allow.
    assert through_proxy("denied-live") == 403
    wait.until(lambda d: "web.test:%s" % origin_port in text("denies"))
    assert "not_allowlisted" in text("denies"), text("denies")
    shot("live-deny")

    # 2. A request filed through the API appears without a reload; the TTL choices name
    # each value once.
    ex = api("POST", "/v1/exceptions", requester, {
        "task_id": "t-1", "requested_hosts": ["web.test"], "requested_ports": [int(origin_port)],
        "ttl_seconds": 600, "reason": "from the browser test"})
    ex_id = ex["id"]
    wait.until(lambda d: d.find_elements(By.ID, "pending-row-" + ex_id))
    choices = [(o.get_attribute("value"), o.text) for o in Select(driver.find_element(By.ID, "ttl-" + ex_id)).options]
    assert choices == [("60", "1 min"), ("300", "5 min"), ("600", "10 min (as asked)")], choices
    assert "by agent-7" in text("pending-row-" + ex_id), text("pending-row-" + ex_id)
    not_reloaded()
    shot("pending")

    # 3. Approve with a TTL choice: in place, and the live denies are still there.
    Select(driver.find_element(By.ID, "ttl-" + ex_id)).select_by_value("60")
    click("approve-" + ex_id)
    wait.until(lambda d: d.find_elements(By.ID, "active-row-" + ex_id))
    wait.until(lambda d: not d.find_elements(By.ID, "pending-row-" + ex_id))
    assert "Approved web.test for task t-1 for 1 min." in text("status"), text("status")
    assert "web.test:%s" % origin_port in text("denies"), "the live denies were lost"
    not_reloaded()

    def left():
        return driver.execute_script(
            "const c = document.querySelector('#active-row-' + arguments[0] + ' .countdown');"
            "return c && c.dataset.left !== undefined ? Number(c.dataset.left) : null;", ex_id)

    wait.until(lambda d: left() is not None)
    first = left()
    assert 55 <= first <= 60, first
    wait.until(lambda d: (left() or first) <= first - 2)
    row = text("active-row-" + ex_id)
    assert "by alice" in row and origin_port in row and "left" in row, row
    shot("approved")

    # 4. Revoke asks first, and takes a note.
    click("revoke-" + ex_id)
    wait.until(lambda d: d.find_elements(By.ID, "revoke-confirm-" + ex_id))
    question = text("revoke-panel-" + ex_id)
    assert "Revoke web.test (port %s) for task t-1 now?" % origin_port in question, question
    assert api("GET", "/v1/exceptions/" + ex_id, approver)["state"] == "approved", "revoked before the confirmation"
    driver.find_element(By.ID, "revoke-note-" + ex_id).send_keys("done with the test")
    # Another request arrives meanwhile: the lists are redrawn, the open question and its
    # note stay, still focused.
    other = api("POST", "/v1/exceptions", requester, {
        "task_id": "t-1", "requested_hosts": ["other.test"], "requested_ports": [int(origin_port)],
        "ttl_seconds": 300, "reason": "a second request"})["id"]
    wait.until(lambda d: d.find_elements(By.ID, "pending-row-" + other))
    note = driver.find_element(By.ID, "revoke-note-" + ex_id)
    assert note.get_attribute("value") == "done with the test"
    assert driver.switch_to.active_element == note, "the note lost the focus"
    shot("revoke-confirm")
    click("revoke-confirm-" + ex_id)
    wait.until(lambda d: not d.find_elements(By.ID, "active-row-" + ex_id))
    wait.until(lambda d: d.find_elements(By.ID, "recent-row-" + ex_id))
    row = text("recent-row-" + ex_id)
    for part in ["revoked", "revoked by alice", "1 min", "done with the test", "from the browser test", origin_port]:
        assert part in row, (part, row)
    state = api("GET", "/v1/exceptions/" + ex_id, approver)
    assert state["state"] == "revoked" and state["ttl_seconds"] == 60 and state["note"] == "done with the test", state
    not_reloaded()
    shot("revoked")

    # 5. Deny (the request that arrived meanwhile) with a note.
    choices = [o.text for o in Select(driver.find_element(By.ID, "ttl-" + other)).options]
    assert choices == ["1 min", "5 min (as asked)"], choices
    click("deny-" + other)
    assert "Deny other.test (port %s) for task t-1?" % origin_port in text("deny-panel-" + other)
    driver.find_element(By.ID, "deny-note-" + other).send_keys("use the mirror")
    click("deny-confirm-" + other)
    wait.until(lambda d: d.find_elements(By.ID, "recent-row-" + other))
    row = text("recent-row-" + other)
    assert "denied by alice" in row and "use the mirror" in row and "asked" in row, row
    assert api("GET", "/v1/exceptions/" + other, approver)["note"] == "use the mirror"
    not_reloaded()
    shot("denied")

    # 6. Allow the live deny for five minutes in one click; the next request passes.
    assert through_proxy("denied-again") == 403
    wait.until(lambda d: "×2" in text("denies"))
    allow = driver.find_element(By.CSS_SELECTOR, "#denies tr.deny button.allow")
    assert Select(driver.find_element(By.CSS_SELECTOR, "#denies tr.deny select.allow-ttl")).first_selected_option.text == "5 min"
    allow.click()
    wait.until(lambda d: "allowed until" in text("denies"))
    assert "recorded as your approval" in text("status"), text("status")
    granted = [e for e in api("GET", "/v1/exceptions", approver)
               if e["state"] == "approved" and e["requested_by"] == "alice"]
    assert len(granted) == 1, granted
    g = granted[0]
    assert g["decided_by"] == "alice" and g["hosts"] == ["web.test"] and g["ports"] == [int(origin_port)], g
    assert g["ttl_seconds"] == 300 and g["task_id"] == "t-1", g
    wait.until(lambda d: d.find_elements(By.ID, "active-row-" + g["id"]))
    assert through_proxy("after-allow") == 200, "the allowed request did not pass"
    not_reloaded()
    shot("allowed")

    # 7. A tweak (more than egress for one sandbox of `sandgate mcp`) is listed with its
    # sandbox and what it asks, in words; the approver narrows it and approves.
    tweak = api("POST", "/v1/exceptions", requester, {
        "task_id": "t-1", "requested_hosts": [], "ttl_seconds": 600, "reason": "the suite needs two minutes and its logs",
        "tweak": {"sandbox": "web", "max_seconds": 120, "max_output_bytes": 10485760, "network": True,
                  "workspace": "/srv/work"}})
    tw = tweak["id"]
    wait.until(lambda d: d.find_elements(By.ID, "pending-row-" + tw))
    row = text("pending-row-" + tw)
    for part in ["tweak: sandbox web", "time limit 120 s, output 10 MiB, network, workspace /srv/work", "10 min"]:
        assert part in row, (part, row)
    assert not driver.find_elements(By.ID, "read-only-" + tw), "a tweak has no read-only box"
    not_reloaded()
    shot("tweak-pending")

    # 8. Approve… asks first, offering no more than was asked; a workspace outside the one
    # asked is refused by the server, which says which field, and nothing changes.
    click("approve-" + tw)
    wait.until(lambda d: d.find_elements(By.ID, "approve-confirm-" + tw))
    assert api("GET", "/v1/exceptions/" + tw, approver)["state"] == "pending", "approved before the confirmation"
    seconds = Select(driver.find_element(By.ID, "tweak-max-seconds-" + tw))
    offered = [o.text for o in seconds.options]
    assert offered == ["not granted", "10 s", "30 s", "60 s", "120 s (as asked)"], offered
    output = Select(driver.find_element(By.ID, "tweak-output-" + tw))
    assert output.options[-1].text == "10 MiB (as asked)" and output.first_selected_option.text == "10 MiB (as asked)"
    seconds.select_by_value("30")
    output.select_by_visible_text("1 MiB")
    network = driver.find_element(By.ID, "tweak-network-" + tw)
    assert network.is_selected()
    network.click()
    workspace = driver.find_element(By.ID, "tweak-workspace-" + tw)
    assert workspace.get_attribute("value") == "/srv/work"
    workspace.clear()
    workspace.send_keys("/srv")
    click("approve-confirm-" + tw)
    wait.until(lambda d: "Refused" in text("status"))
    assert "tweak.workspace /srv is not /srv/work" in text("status"), text("status")
    assert api("GET", "/v1/exceptions/" + tw, approver)["state"] == "pending"
    workspace.clear()
    workspace.send_keys("/srv/work/build")
    not_reloaded()
    shot("tweak-narrowing")
    click("approve-confirm-" + tw)
    wait.until(lambda d: d.find_elements(By.ID, "active-row-" + tw))
    wait.until(lambda d: not d.find_elements(By.ID, "pending-row-" + tw))
    narrowed = "time limit 30 s, output 1 MiB, workspace /srv/work/build"
    assert "Approved sandbox web: " + narrowed + " for task t-1 for 10 min." in text("status"), text("status")
    row = text("active-row-" + tw)
    assert "tweak: sandbox web" in row and narrowed in row and "network" not in row and "by alice" in row, row
    granted = api("GET", "/v1/exceptions/" + tw, approver)
    assert granted["tweak"] == {"sandbox": "web", "max_seconds": 30, "max_output_bytes": 1048576,
                                "workspace": "/srv/work/build"}, granted
    not_reloaded()
    shot("tweak-approved")

    # 9. Revoking it asks for confirmation, says what it does, and takes a note.
    click("revoke-" + tw)
    wait.until(lambda d: d.find_elements(By.ID, "revoke-confirm-" + tw))
    question = text("revoke-panel-" + tw)
    assert "Revoke sandbox web: " + narrowed + " for task t-1 now?" in question, question
    assert "The next run no longer gets it" in question, question
    assert api("GET", "/v1/exceptions/" + tw, approver)["state"] == "approved", "revoked before the confirmation"
    driver.find_element(By.ID, "revoke-note-" + tw).send_keys("the suite is fixed")
    shot("tweak-revoke-confirm")
    click("revoke-confirm-" + tw)
    wait.until(lambda d: d.find_elements(By.ID, "recent-row-" + tw))
    row = text("recent-row-" + tw)
    for part in ["revoked by alice", "tweak: sandbox web", narrowed, "the suite is fixed", "10 min"]:
        assert part in row, (part, row)
    assert "Revoked sandbox web: " + narrowed + " for task t-1." in text("status"), text("status")
    state = api("GET", "/v1/exceptions/" + tw, approver)
    assert state["state"] == "revoked" and state["note"] == "the suite is fixed", state
    not_reloaded()
    shot("tweak-revoked")

    # 10. A viewer sees the lists and no action.
    driver.delete_all_cookies()
    driver.get(admin + "/ui")
    driver.find_element(By.ID, "token").send_keys(viewer)
    driver.find_element(By.ID, "login").click()
    wait.until(lambda d: d.find_elements(By.ID, "active-row-" + g["id"]))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "body[data-live=open]"))
    assert through_proxy("seen-by-viewer", host="other.test") == 403
    wait.until(lambda d: "other.test:%s" % origin_port in text("denies"))
    assert not driver.find_elements(By.ID, "revoke-" + g["id"]), "a viewer was offered revoke"
    visible = [b.text for b in driver.find_elements(By.CSS_SELECTOR, "button") if b.is_displayed()]
    assert visible == ["Log out"], visible
    shot("viewer")
    print("OK", ex_id, g["id"])
    for s in steps:
        print("screenshot", s)
finally:
    driver.quit()
