"""Each framework's agent asked for a story, its run streamed: prints the
text as the run gave it, and the final output. argv[1]: openai-agents or
pydantic-ai."""

import asyncio
import json
import logging
import sys

from agentbay import Worker

FRAMEWORK = sys.argv[1]


def tell(ctx):
    prompt = f"Write a story about {ctx.input['customer']}."
    pieces: list[str] = []
    if FRAMEWORK == "openai-agents":
        from agents import Agent

        from agentbay.openai_agents import run

        result = run(Agent(name="teller", instructions="Tell stories."), prompt, on_text=pieces.append)
        final = result.final_output
    else:
        from pydantic_ai import Agent

        from agentbay.pydantic_ai import AgentbayAgent

        durable = AgentbayAgent(Agent(instructions="Tell stories."))

        async def streamed():
            async with durable.run_stream(prompt) as result:
                async for delta in result.stream_text(delta=True):
                    pieces.append(delta)
                return await result.get_output()

        final = asyncio.run(streamed())
    print("STREAMED " + json.dumps({"pieces": len(pieces), "read": "".join(pieces), "final": final}), flush=True)
    return {"severity": "low", "summary": "a story was told", "paged": False}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    Worker(agent="triage").run(tell, max_attempts=1)
    print("WORKER DONE", flush=True)
