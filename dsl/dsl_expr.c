/* placeholder: being written */ typedef int ds4_placeholder_dsl_expr;
