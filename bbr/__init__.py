"""Body-Based Router: reads `model` from the JSON body and sets the routing headers."""
