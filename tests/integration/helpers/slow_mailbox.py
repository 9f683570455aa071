"""An aiosmtpd handler for the mail tests: it stores each message, then
waits before answering 250, so a sender killed during the wait has
delivered a message it never heard was taken."""

import asyncio
import os

from aiosmtpd.handlers import Mailbox


class SlowMailbox(Mailbox):
    async def handle_DATA(self, server, session, envelope):
        answer = await super().handle_DATA(server, session, envelope)
        await asyncio.sleep(float(os.environ.get("SLOW_MAILBOX_SECS", "4")))
        return answer
