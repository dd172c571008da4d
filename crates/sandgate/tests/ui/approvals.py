"""The approvals page in a real browser (Debian's headless Chromium, driven by Selenium).

Usage: approvals.py ADMIN_URL APPROVER_TOKEN REQUESTER_TOKEN SCREENSHOT_PATH ORIGIN_PORT PROXY_ADDR

Logs in, sees a deny through the proxy appear live, files a request through the API as the requester, watches it appear on the page
without a reload, approves it with a TTL choice, watches the countdown fall, revokes it, and
checks the outcome through the API. Prints OK at the end; any failure raises.
"""

import json
import sys
import tempfile
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

admin, approver, requester, shot = sys.argv[1:5]


def api(method, path, token, body=None):
    req = urllib.request.Request(admin + path, method=method, data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", "Bearer " + token)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


opts = webdriver.ChromeOptions()
opts.binary_location = "/usr/bin/chromium"
for flag in ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--window-size=1200,900", "--user-data-dir=" + tempfile.mkdtemp()]:
    opts.add_argument(flag)
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
wait = WebDriverWait(driver, 15, poll_frequency=0.1)
try:
    driver.get(admin + "/ui")
    driver.find_element(By.ID, "token").send_keys(approver)
    driver.find_element(By.ID, "login").click()
    wait.until(lambda d: "Logged in as alice" in d.page_source)
    assert "tok-" not in driver.current_url and approver not in driver.page_source, "the token leaked into the page"
    cookie = driver.get_cookie("sandgate_session")
    assert cookie and cookie["httpOnly"] and cookie["sameSite"] == "Strict", cookie

    # A deny through the proxy shows up on the page as it happens.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://" + sys.argv[6]}))
    try:
        opener.open("http://web.test:%s/denied-live" % sys.argv[5], timeout=10)
        raise AssertionError("the request was not denied")
    except urllib.error.HTTPError as e:
        assert e.code == 403, e.code
    wait.until(lambda d: "web.test:" in d.find_element(By.ID, "denies").text)

    ex = api("POST", "/v1/exceptions", requester, {
        "task_id": "t-1", "requested_hosts": ["web.test"], "requested_ports": [int(sys.argv[5])],
        "ttl_seconds": 300, "reason": "from the browser test"})
    ex_id = ex["id"]
    before = driver.execute_script("return performance.timeOrigin")
    wait.until(lambda d: d.find_elements(By.ID, "pending-row-" + ex_id))
    assert driver.execute_script("return performance.timeOrigin") == before, "the page reloaded"

    Select(driver.find_element(By.ID, "ttl-" + ex_id)).select_by_value("60")
    driver.find_element(By.ID, "approve-" + ex_id).click()
    wait.until(lambda d: d.find_elements(By.ID, "active-row-" + ex_id))

    def left():
        # One script call: the row is redrawn every second, so no element is held across calls.
        return driver.execute_script(
            "const c = document.querySelector('#active-row-' + arguments[0] + ' .countdown');"
            "return c ? Number(c.dataset.left) : null;", ex_id)

    first = left()
    assert first is not None and 55 <= first <= 60, first
    wait.until(lambda d: (left() or first) <= first - 2)
    driver.save_screenshot(shot)

    wait.until(lambda d: d.find_elements(By.ID, "revoke-" + ex_id))
    for _ in range(5):  # the active row is redrawn every second; retry a stale click
        try:
            driver.find_element(By.ID, "revoke-" + ex_id).click()
            break
        except Exception:
            time.sleep(0.2)
    wait.until(lambda d: not d.find_elements(By.ID, "active-row-" + ex_id))
    wait.until(lambda d: "revoked" in d.find_element(By.ID, "recent").text)
    state = api("GET", "/v1/exceptions/" + ex_id, approver)
    assert state["state"] == "revoked" and state["ttl_seconds"] == 60, state
    print("OK", ex_id)
finally:
    driver.quit()
