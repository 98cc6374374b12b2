"""Open a run's trace in Perfetto (ui.perfetto.dev) with one click, by Perfetto's documented
postMessage protocol ("Deep linking to Perfetto UI": open the UI in a new window, post 'PING'
until it answers 'PONG', then post {perfetto: {buffer, title, fileName}}); Perfetto reads gzip'd
JSON traces as they are. The trace travels from the dashboard's page into the user's browser
and from there to the Perfetto tab: nothing is uploaded to a server.

The bytes are embedded in the page (base64), so this is offered for traces up to
PERFETTO_INLINE_MB; larger ones are downloaded and opened in Perfetto by hand. Perfetto itself
cannot be reached from the test machines: tests/test_e2e_browser.py answers for it with a
stand-in page that speaks the same protocol and checks the bytes it is sent."""

from __future__ import annotations

import base64
import json

PERFETTO_URL = "https://ui.perfetto.dev"
PERFETTO_INLINE_MB = 8  # largest trace file offered with the one-click button (sent with the page, a third bigger)


def perfetto_button_html(trace: bytes, title: str, file_name: str) -> str:
    """A self-contained button (for st.components.v1.html) that opens PERFETTO_URL in a new
    window and posts it `trace`; its label says when Perfetto does not answer within 20 s."""
    payload = base64.b64encode(trace).decode("ascii")
    # JSON in a <script>: "<" escaped, so no text of the data can close the element
    args = json.dumps({"url": PERFETTO_URL, "title": title, "fileName": file_name}).replace("<", "\\u003c")
    return f"""<button id="open" style="font: 14px sans-serif; padding: 6px 12px; border-radius: 8px;
 border: 1px solid #ccc; background: white; cursor: pointer">Open in Perfetto (new tab)</button>
<span id="state" style="font: 13px sans-serif; color: #666; margin-left: 8px"></span>
<script>
const args = {args};
const b64 = "{payload}";
function bytes() {{
  const raw = atob(b64), out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out.buffer;
}}
document.getElementById("open").onclick = () => {{
  const state = document.getElementById("state");
  const ui = window.open(args.url);
  if (!ui) {{ state.textContent = "the browser blocked the new tab: allow pop-ups, or download the trace"; return; }}
  state.textContent = "waiting for Perfetto...";
  let tries = 0;
  const ping = setInterval(() => {{
    if (++tries > 40) {{ clearInterval(ping); state.textContent = "Perfetto did not answer: download the trace"; }}
    else ui.postMessage("PING", args.url);
  }}, 500);
  window.addEventListener("message", (e) => {{
    if (e.source !== ui || e.data !== "PONG") return;
    clearInterval(ping);
    ui.postMessage({{perfetto: {{buffer: bytes(), title: args.title, fileName: args.fileName}}}}, args.url);
    state.textContent = "sent to Perfetto";
  }});
}};
</script>"""
