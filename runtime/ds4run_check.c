/* placeholder */ typedef int ds4_placeholder_check;
