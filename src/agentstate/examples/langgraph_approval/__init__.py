"""A LangGraph agent whose tool needs a human's approval, checkpointed on the state service.

    python -m agentstate.examples.langgraph_approval start  --address HOST:PORT --thread T
    python -m agentstate.examples.langgraph_approval resume --address HOST:PORT --thread T \
        --approve no

`start` runs until the approval interrupt (this project's confirmation card) and exits;
`resume`, from any other process or machine, answers it with `Command(resume=...)`.
"""
