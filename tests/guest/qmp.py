#!/usr/bin/env python3
"""A minimal QMP client for tests/guest/live.sh (Python's standard library).

  qmp.py SOCKET COMMAND [JSON-ARGUMENTS]
      runs one command; prints its "return" value as JSON, or its error
      (class: description) on stderr with exit status 1
  qmp.py SOCKET --migrate URI SECONDS
      migrates the VM to URI (with max-bandwidth 1 GiB/s), polling
      query-migrate every 0.5 s until it completed or failed, on one
      connection; prints the last answer as JSON; exit status 0 when
      completed, 1 when refused, failed, cancelled or still running after
      SECONDS
"""
import json
import socket
import sys
import time


class Qmp:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(path)
        self.file = self.sock.makefile("rb")
        self.read()  # the greeting
        self.command("qmp_capabilities")

    def read(self):
        line = self.file.readline()
        if not line:
            raise ConnectionError("QMP connection closed")
        return json.loads(line)

    def command(self, name, arguments=None):
        msg = {"execute": name}
        if arguments:
            msg["arguments"] = arguments
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            reply = self.read()
            if "event" in reply:
                continue
            if "error" in reply:
                raise RuntimeError("%s: %s" % (reply["error"].get("class"), reply["error"].get("desc")))
            return reply.get("return")


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    try:
        qmp = Qmp(argv[1])
        if argv[2] == "--migrate":
            qmp.command("migrate-set-parameters", {"max-bandwidth": 1 << 30})
            qmp.command("migrate", {"uri": argv[3]})
            deadline = time.monotonic() + float(argv[4])
            while True:
                info = qmp.command("query-migrate")
                status = info.get("status")
                if status in ("completed", "failed", "cancelled") or time.monotonic() > deadline:
                    print(json.dumps(info))
                    return 0 if status == "completed" else 1
                time.sleep(0.5)
        arguments = json.loads(argv[3]) if len(argv) > 3 else None
        print(json.dumps(qmp.command(argv[2], arguments)))
        return 0
    except (OSError, ValueError, RuntimeError) as e:
        sys.stderr.write("qmp: %s\n" % e)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
