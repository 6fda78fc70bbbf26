"""Example tasks (a task module of your own, agents with tools and a game), importable from any project directory."""
