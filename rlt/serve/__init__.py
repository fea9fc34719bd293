"""`rlt serve`: an OpenAI-compatible HTTP server over rlt.Engine (FastAPI + uvicorn), a client of
the engine's public API in the server's own event loop. docs/serve.md is its user's reference.

Modules:
  server.py           the command: the port bound first, options checked, then uvicorn (uvloop) on
                      that socket with the engine in its loop; rlt's log to stderr
  app.py              FastAPI routes: health, version, metrics, models; the rest in generate.py
  generate.py         completions, chat, /tokenize, /detokenize: one engine call per prompt,
                      a client's disconnect aborts
  responses.py        the Responses API as a second shape of the chat pipeline; response_events.py:
                      its streamed events
  requests.py         typed request models per endpoint: every OpenAI / vLLM field honoured,
                      accepted (no effect on output) or refused naming it; -> SamplingParams
  structured.py       a request's grammar (response_format, structured_outputs, guided_*,
                      tool_choice) -> rlt.StructuredOutput
  chat.py             messages (text parts, tool calls, tool turns) through the chat template;
                      template_sandbox.py renders templates under bounds
  choices.py          each choice's outputs and what was sent; a streamed response's events,
                      bounded
  openai_api.py       response pieces: logprobs (echo: the prompt's too), prompt_logprobs, usage
  limits.py           bounds on a request (body bytes and time, prompts, messages, prompt length)
                      and the thread pool that tokenizes and renders chats off the loop
  errors.py           every error in OpenAI's shape, messages bounded, 503/500 generic
  connections.py      uvicorn's httptools protocol with a header timeout and size, a connection cap
  flags.py            the HTTP flags (light: the CLI imports it for every command)
  shutdown.py         uvicorn's server with a shutdown deadline, SIGHUP, exit 1 if the engine fails
  middleware.py       around every request: X-Request-Id, its record for the handlers, a log line,
                      CORS

A structured-output request whose prompt opens a reasoning block has its grammar wait for
`</think>`'s ids in the output (StructuredOutput.after), as vLLM's structured-output manager starts
its matcher once the reasoning parser sees the end. The server runs the coordinator's grammar
check (rlt/contract/grammar.py) first, in two threads at nice 10, so its event loop finds the
result cached and a burst of large schemas does not take the cores from the streams.
"""
