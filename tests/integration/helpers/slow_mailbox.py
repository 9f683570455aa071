"""aiosmtpd handlers for the mail tests: one stores each message, then
waits before answering 250, so a sender killed during the wait has
delivered a message it never heard was taken; one refuses some mailboxes."""

import asyncio
import os

from aiosmtpd.handlers import Mailbox


class SlowMailbox(Mailbox):
    async def handle_DATA(self, server, session, envelope):
        answer = await super().handle_DATA(server, session, envelope)
        await asyncio.sleep(float(os.environ.get("SLOW_MAILBOX_SECS", "4")))
        return answer


class PickyMailbox(Mailbox):
    """Refuses for good (550) every recipient whose address starts with
    `refused-`, as a server without that mailbox does; stores the rest."""

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.startswith("refused-"):
            return "550 5.1.1 No such mailbox here"
        envelope.rcpt_tos.append(address)
        return "250 OK"
