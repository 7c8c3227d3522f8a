"""Tags: properties of symbols that passes ask about instead of matching names."""
import enum


class Tag(enum.Enum):
    PRIM = "prim"                 # in the closed set every executor must run
    OPAQUE = "opaque"             # torch op without decomposition: run as one torch call
    INPLACE = "inplace"           # writes into one of its arguments (copy_ and friends)
    RANDOM = "random"             # draws from a random generator
    ALIAS_BARRIER = "alias_barrier"  # inserted by update_aliases
    VIEW = "view"                 # declared (executor impl, custom op): output may alias its first tensor arg
    DONT_DCE = "dont_dce"         # has an effect DCE cannot see (prints, collectives...)
    RETURN = "return"
    FUSION = "fusion"             # a region compiled by a fusion executor
    ORDER_BARRIER = "order_barrier"  # no symbol moves across it (grad-mode switches)
    UNBACKED = "unbacked"         # outputs a number known only at run time (nonzero's length, item()):
                                  # a composite calling it is recorded as its decomposition
    WRITES_BELOW_AUTOGRAD = "writes_below_autograd"  # its writes run where autograd does not check them
                                  # (a torch.library.custom_op): eager refuses no write into a leaf
    HIDDEN_VIEW = "hidden_view"   # outputs share storage with inputs but autograd does not know them as
                                  # views (unsafe_split): a write into one is not a write into a leaf's view
    SIZE_CHECK = "size_check"     # checks when the program runs a size fact the trace assumed: a
                                  # composite calling it is recorded as its decomposition too

    # members are singletons: identity hashing is exact and avoids Enum's Python-level
    # __hash__, which passes call thousands of times per compile (``tag in sym.tags``)
    __hash__ = object.__hash__
